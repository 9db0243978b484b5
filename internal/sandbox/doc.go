// Package sandbox runs a program that PAL does not trust (a process
// step's program; a stdio server) in a bubblewrap sandbox, bounded, and
// ends all of it with the step.
//
// # What the program sees
//
// bwrap (Debian's bubblewrap, unprivileged: it needs user namespaces)
// gives it its own mount, PID, IPC, UTS, cgroup and user namespaces, and
// its own network namespace with only loopback; nested user namespaces
// are refused (--disable-userns). The filesystem is a read-only root
// holding a read-only view of /usr and of /bin, /sbin and /lib* (bound,
// or the same symlinks into /usr), a few files of /etc (ld.so.cache, TLS
// certificates, alternatives, localtime, services, protocols, nsswitch.conf
// and a generated passwd, group and hosts), its own /proc and /dev, and
// three tmpfs of Limits.Disk bytes each: the work directory WorkDir (its
// HOME), /tmp and /dev/shm. Besides, only what the worker binds: the
// program file itself when it lives outside those directories, the
// operator's Config.Mounts (read-only unless marked writable), with each
// of Config.Private under them hidden, and the directory IPCDir holding
// the Unix sockets of Process.Listen. Nothing of the worker's data
// directory, home, key files or environment: the environment is
// Spec.Env alone.
//
// When the worker runs as root, the sandboxes run as UID, a host uid that
// owns no file, so even a file that leaked into view would keep its mode
// (the worker's keys are 0600); as another user, the sandbox runs as that
// user and only the namespaces keep the worker's files out of view. In
// its user namespace the program is uid and gid 1000 ("pal").
//
// # The processes
//
// The worker starts its own binary again under a hidden name (Init must
// be called first thing in main, and in a test binary's TestMain): the
// host init waits until the worker has put it in the step's cgroups, sets
// the rlimits and executes bwrap. In the sandbox, the binary again, bound
// read-only at InitPath, is the parent of the program: it runs the egress
// forwarder, stops everything when the work directory, /tmp or /dev/shm
// fills up, fans a terminate out to every process (kill(-1)), and reports
// how the program ended over a pipe. When it exits, bwrap's PID 1 exits
// and the kernel ends every process of the PID namespace, setsid or not.
// When the worker dies, even by kill -9, the parent-death signal ends
// bwrap, and --die-with-parent the rest.
//
// # Limits
//
// Memory and processes through a cgroup of the step (v1 or v2, created
// under the worker's own and removed after) where the worker may create
// one, else RLIMIT_AS and RLIMIT_NPROC; CPU time (per process) and file
// size through RLIMIT_CPU and RLIMIT_FSIZE; the work directory, /tmp and
// /dev/shm by the size of their tmpfs, which count towards the memory
// limit. A process limit reached (pids.events) or a tmpfs filled stops
// the program at once; Result.Limit names the limit that stopped it.
//
// # Network
//
// NetworkNone: loopback only. NetworkEgress: the sandbox keeps its own
// network namespace; the init listens on ProxyAddr there and relays each
// connection over a Unix socket to an HTTP proxy in the worker (CONNECT,
// and absolute-form requests for http://), which dials with Spec.Dial
// (the worker's egress policy: it resolves the name itself and checks
// the address it connects to). The program gets HTTP_PROXY, HTTPS_PROXY
// and ALL_PROXY; a connection that does not go through the proxy has
// nowhere to go. There is no resolver in the sandbox.
//
// # Without a sandbox
//
// Config.Off runs the program directly, as the worker's user, in its own
// process group with the rlimits and cgroups above (when the machine has
// them) and a fresh work directory: it is unsafe, for machines where
// bubblewrap cannot run. Runner.Available tells why a sandbox is not
// available; it is probed once.
package sandbox
