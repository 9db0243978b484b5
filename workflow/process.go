package workflow

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"regexp"
	"slices"
	"strings"
)

// A process node's program comes from its definition and what arrives in
// data (the run input, step outputs) stays data: it may fill an argument,
// an environment value or stdin, never choose the program, the code a
// shell or interpreter runs, or a variable that makes the program load
// other code. Parse refuses what would break that; the engine checks the
// environment again when it renders (engine.ProcessInput), and the worker
// before it starts anything.

// ProcessLimits bounds a process node's program in its sandbox (package
// internal/sandbox): memory and processes through a cgroup where the
// machine has one (else rlimits), CPU time and file size through rlimits,
// the work directory and /tmp as tmpfs of a fixed size. A program stopped
// by a limit fails its step with the limit named.
type ProcessLimits struct {
	// MemoryMb bounds the memory of the program and its descendants,
	// the work directory's and /tmp's files included (they are in memory),
	// in MiB.
	MemoryMb int `json:"memoryMb,omitempty"`
	// CPUSeconds bounds the CPU time of each process (RLIMIT_CPU).
	CPUSeconds int `json:"cpuSeconds,omitempty"`
	// MaxProcesses bounds the processes and threads alive at once
	// (default DefaultMaxProcesses).
	MaxProcesses int `json:"maxProcesses,omitempty"`
	// FileSizeMb bounds the size of a file the program writes
	// (RLIMIT_FSIZE), in MiB.
	FileSizeMb int `json:"fileSizeMb,omitempty"`
	// WorkdirMb bounds the work directory, and /tmp apart from it, in MiB
	// (default DefaultWorkdirMb).
	WorkdirMb int `json:"workdirMb,omitempty"`
}

// Defaults of a process node's limits.
const (
	DefaultMaxProcesses = 256
	DefaultWorkdirMb    = 256
)

// Processes returns the effective process bound.
func (l *ProcessLimits) Processes() int {
	if l == nil || l.MaxProcesses <= 0 {
		return DefaultMaxProcesses
	}
	return l.MaxProcesses
}

// Workdir returns the effective work directory bound, in MiB.
func (l *ProcessLimits) Workdir() int {
	if l == nil || l.WorkdirMb <= 0 {
		return DefaultWorkdirMb
	}
	return l.WorkdirMb
}

// A process node's network: none (loopback only, the default) or egress
// (connections through the worker, where its egress policy allows).
const (
	NetworkNone   = "none"
	NetworkEgress = "egress"
)

// ProcessData is the data of a process node: a program the worker runs
// in a sandbox.
type ProcessData struct {
	// Command is the argv. Command[0], the program, is a name looked up on
	// the sandbox's PATH or an absolute path, never a template; every
	// other element is a template rendered to exactly one argument.
	Command []string `json:"command"`
	// Env adds to the program's clean environment; values are templates.
	Env map[string]string `json:"env,omitempty"`
	// Workdir is where the program starts: a path in the sandbox (relative
	// to its work directory when not absolute).
	Workdir string `json:"workdir,omitempty"`
	// Input is written to the program's stdin as JSON; strings are
	// templates.
	Input     json.RawMessage `json:"input,omitempty"`
	TimeoutMs int             `json:"timeoutMs,omitempty"`
	// MaxResumes bounds the re-drives of a step whose process did not
	// finish (nil: DefaultMaxResumes).
	MaxResumes *int           `json:"maxResumes,omitempty"`
	Limits     *ProcessLimits `json:"limits,omitempty"`
	// Network is NetworkNone (also when empty) or NetworkEgress.
	Network string `json:"network,omitempty"`
}

// envName is what a process node's env may name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// DefaultMaxResumes is how often a process step is re-driven after its
// process did not finish, when the node sets no maxResumes.
const DefaultMaxResumes = 3

// Resumes returns the effective resume bound.
func (d *ProcessData) Resumes() int {
	if d.MaxResumes == nil {
		return DefaultMaxResumes
	}
	return *d.MaxResumes
}

// Process decodes the data of a process node.
func (n *Node) Process() (*ProcessData, error) {
	var d ProcessData
	if err := n.decode(TypeProcess, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// reservedEnv are variables a process's env may not set: PAL sets them,
// or they make the dynamic loader, libc or a shell load or run other code
// (glibc's list of variables it drops for set-user-ID programs, and the
// shells' start-up variables).
var reservedEnv = []string{"PATH", "HOME", "TMPDIR", "GCONV_PATH", "GETCONF_DIR", "GLIBC_TUNABLES", "HOSTALIASES",
	"LOCALDOMAIN", "LOCPATH", "MALLOC_TRACE", "NIS_PATH", "NLSPATH", "RESOLV_HOST_CONF", "RES_OPTIONS", "TZDIR",
	"BASH_ENV", "ENV", "IFS", "SHELLOPTS", "BASHOPTS", "PS4", "PROMPT_COMMAND", "HTTP_PROXY", "HTTPS_PROXY",
	"ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy", "no_proxy"}

// reservedEnvPrefixes are prefixes of reserved variables.
var reservedEnvPrefixes = []string{"PAL_", "LD_", "BASH_FUNC_"}

// codeEnv are variables that choose code an interpreter or tool loads or
// runs: a definition may set them, but only to a constant.
var codeEnv = []string{"NODE_OPTIONS", "NODE_PATH", "PERL5LIB", "PERLLIB", "PERL5OPT", "RUBYLIB", "RUBYOPT",
	"GEM_HOME", "GEM_PATH", "BUNDLE_GEMFILE", "CLASSPATH", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS",
	"LUA_PATH", "LUA_CPATH", "LUA_INIT", "PHPRC", "PHP_INI_SCAN_DIR", "R_PROFILE", "R_PROFILE_USER", "R_LIBS",
	"EDITOR", "VISUAL", "PAGER", "BROWSER", "SSH_ASKPASS"}

// codeEnvPrefixes are prefixes of such variables.
var codeEnvPrefixes = []string{"PYTHON", "GIT_"}

// ProcessEnvProblem says why a process's env may not set name, or "" if
// it may.
func ProcessEnvProblem(name string) string {
	switch {
	case !envName.MatchString(name):
		return "not a variable name (letters, digits and _, not starting with a digit; at most 128)"
	case strings.HasPrefix(name, "PAL_"):
		return "names starting with PAL_ are set by PAL"
	case slices.Contains(reservedEnv, name):
		return fmt.Sprintf("%s is set by PAL or makes the loader or a shell run other code; a process's env may not set it", name)
	}
	for _, p := range reservedEnvPrefixes {
		if strings.HasPrefix(name, p) {
			return fmt.Sprintf("variables starting with %s make the loader or a shell run other code; a process's env may not set them", p)
		}
	}
	return ""
}

// CodeEnv reports whether variable name chooses code a program loads, so
// that its value may only be a constant.
func CodeEnv(name string) bool {
	if slices.Contains(codeEnv, name) {
		return true
	}
	for _, p := range codeEnvPrefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// HasPlaceholder reports whether s is a template with a placeholder (a
// string that does not parse counts as one).
func HasPlaceholder(s string) bool {
	if !strings.Contains(s, "{{") {
		return false
	}
	t, err := parseTemplate(s)
	return err != nil || len(t.phs) > 0
}

// checkProcess checks a process node's data beyond the schema.
func checkProcess(id string, d *ProcessData, tmpl func(field, s string), ps *problems) {
	for i, a := range d.Command {
		tmpl(fmt.Sprintf("data.command[%d]", i), a)
	}
	if len(d.Command) > 0 {
		for _, p := range CommandProblems(d.Command) {
			ps.node(id, fmt.Sprintf("data.command[%d]", p.Index), "%s", p.Message)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(d.Env)) {
		if msg := ProcessEnvProblem(k); msg != "" {
			ps.node(id, joinField("data.env", k), "%s", msg)
			continue
		}
		if CodeEnv(k) && HasPlaceholder(d.Env[k]) {
			ps.node(id, joinField("data.env", k), "%s chooses code the program loads: set it to a constant, not a template", k)
			continue
		}
		tmpl(joinField("data.env", k), d.Env[k])
	}
	if HasPlaceholder(d.Workdir) {
		ps.node(id, "data.workdir", "the working directory is part of the definition, not a template")
	}
	switch d.Network {
	case "", NetworkNone, NetworkEgress:
	default:
		ps.node(id, "data.network", "%q is not a network (want %q or %q)", d.Network, NetworkNone, NetworkEgress)
	}
}

// CommandProblem is an argument of a process's command that could let
// data become code.
type CommandProblem struct {
	Index   int
	Message string
}

// Programs that run code given in an argument, by file name without a
// version ("python3.11" is python).
var (
	shells   = []string{"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh", "fish", "csh", "tcsh"}
	launcher = []string{"env", "xargs", "nohup", "timeout", "nice", "setsid", "sudo", "doas", "su", "runuser",
		"stdbuf", "chroot", "unshare", "nsenter", "setpriv", "ionice", "taskset", "chrt", "flock", "time", "watch",
		"strace", "ltrace", "parallel", "busybox", "bwrap", "firejail", "script", "exec", "command", "find",
		// Tools whose subcommands run code named by an argument.
		"deno", "npx", "npm", "pnpm", "yarn", "uv", "uvx", "pipx", "poetry", "cargo", "go", "dotnet", "make"}
	// interpreters maps a language to the options whose value is code.
	interpreters = map[string][]string{
		"python": {"-c", "-m"}, "pypy": {"-c", "-m"}, "node": {"-e", "--eval", "-p", "--print", "-r", "--require", "--import"},
		"nodejs": {"-e", "--eval", "-p", "--print", "-r", "--require"}, "bun": {"-e", "--eval", "-p", "--print"},
		"perl": {"-e", "-E", "-M", "-m"}, "ruby": {"-e", "-r"}, "php": {"-r"}, "lua": {"-e", "-l"}, "luajit": {"-e", "-l"},
		"rscript": {"-e"}, "julia": {"-e", "-E"}, "tclsh": {}, "java": {"-jar", "-cp", "-classpath", "--class-path"}, "awk": {"-f", "-e", "--source"}, "gawk": {"-f", "-e", "--source"},
		"mawk": {"-f"}, "nawk": {"-f"}, "sed": {"-e", "--expression", "-f", "--file"}, "gsed": {"-e", "--expression", "-f", "--file"},
	}
	versionSuffix = regexp.MustCompile(`[0-9.]+$`)
)

// programKind names the kind of program argv0 is by its file name.
func programKind(argv0 string) string {
	return strings.ToLower(versionSuffix.ReplaceAllString(path.Base(argv0), ""))
}

// CommandProblems returns the arguments of command that could turn data
// into code: a template in the program (command[0]), a relative program
// path, a template in any argument of a launcher (env, xargs, timeout,
// sudo, …), and a template in the code or script argument of a shell or
// interpreter (`sh -c '…'`, `python3 -c`, `python3 script.py`, `awk
// 'program'`) or in any of its options. A template elsewhere is one
// argument of data: pass values to a shell as "$1" after the script.
func CommandProblems(command []string) []CommandProblem {
	var out []CommandProblem
	bad := func(i int, format string, args ...any) {
		out = append(out, CommandProblem{Index: i, Message: fmt.Sprintf(format, args...)})
	}
	prog := command[0]
	switch {
	case HasPlaceholder(prog):
		bad(0, "the program is part of the definition, not a template")
		return out
	case prog == "":
		bad(0, "the program is empty")
		return out
	case strings.Contains(prog, "/") && !strings.HasPrefix(prog, "/"):
		bad(0, "the program is a name looked up on PATH or an absolute path, not the relative path %q", prog)
	}
	kind := programKind(prog)
	switch {
	case slices.Contains(launcher, kind):
		for i := 1; i < len(command); i++ {
			if HasPlaceholder(command[i]) {
				bad(i, "%s starts another program from its arguments: a template here could choose it", kind)
			}
		}
	case slices.Contains(shells, kind):
		codeArgs(command, func(o string) bool { return !strings.HasPrefix(o, "--") && strings.Contains(o[1:], "c") }, true,
			func(i int, what string) {
				bad(i, "a template in %s of %s could become shell code: pass the value as an argument after the script (\"$1\")", what, kind)
			})
	default:
		flags, ok := interpreters[kind]
		if !ok {
			return out
		}
		codeArgs(command, func(o string) bool { return slices.Contains(flags, o) }, false,
			func(i int, what string) {
				bad(i, "a template in %s of %s could become code: pass the value as an argument after the script, or on stdin", what, kind)
			})
	}
	return out
}

// codeArgs walks a shell's or interpreter's arguments and calls bad for
// each one holding a template that is code: an option, the value of a
// code option (for a shell with -c, the first operand), or the script
// operand when no code option came first. Operands after the code are
// data.
func codeArgs(command []string, isCode func(opt string) bool, shell bool, bad func(i int, what string)) {
	codeNext, codeGiven := false, false
	for i := 1; i < len(command); i++ {
		a := command[i]
		switch {
		case codeNext && !shell:
			if HasPlaceholder(a) {
				bad(i, "the code argument")
			}
			codeNext = false
		case a == "--":
			if i+1 < len(command) && !codeGiven && HasPlaceholder(command[i+1]) {
				bad(i+1, "the script argument")
			}
			return
		case len(a) > 1 && strings.HasPrefix(a, "-"):
			if HasPlaceholder(a) {
				bad(i, "an option")
			}
			if isCode(a) {
				codeNext, codeGiven = true, true
			} else if opt, _, ok := strings.Cut(a, "="); ok && isCode(opt) {
				codeGiven = true // --eval=…: the code is in the option itself
			}
		default:
			// The first operand: the code after a shell's -c, else the
			// script (or, for awk and sed, the program text).
			if HasPlaceholder(a) && (codeNext || !codeGiven) {
				what := "the script argument"
				if codeNext {
					what = "the command string"
				}
				bad(i, what)
			}
			return
		}
	}
}
