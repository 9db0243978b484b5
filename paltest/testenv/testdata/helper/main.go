// Command helper is a stand-in child process for testenv's own tests.
//
// It prints "helper ready", then waits: SIGUSR1 prints "usr1 <n>", SIGTERM
// prints "helper terminated" and exits 0. With -env it first prints its
// environment; with -exit N it exits with status N at once.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	env := flag.Bool("env", false, "print the environment")
	exit := flag.Int("exit", -1, "exit at once with this status")
	flag.Parse()
	if *env {
		for _, kv := range os.Environ() {
			fmt.Println("env:", kv)
		}
	}
	if *exit >= 0 {
		fmt.Println("helper exiting")
		os.Exit(*exit)
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGTERM)
	fmt.Println("helper ready")
	usr1 := 0
	for sig := range sigs {
		if sig == syscall.SIGTERM {
			fmt.Println("helper terminated")
			return
		}
		usr1++
		fmt.Println("usr1", usr1)
	}
}
