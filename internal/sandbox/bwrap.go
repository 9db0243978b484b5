package sandbox

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// systemDirs are the host directories every sandbox sees, read-only (or
// as the same symlinks, where /bin and the like point into /usr).
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"}

// etcFiles are the files of /etc a program may need: the loader's cache,
// TLS certificates, Debian's alternatives, the time zone, name service
// and port names. passwd, group and hosts are generated.
var etcFiles = []string{"ld.so.cache", "ld.so.conf", "ld.so.conf.d", "ssl", "ca-certificates", "ca-certificates.conf",
	"pki", "crypto-policies", "alternatives", "localtime", "timezone", "nsswitch.conf", "protocols", "services",
	"mime.types", "os-release"}

// inSystemDir reports whether the sandbox sees p through a system
// directory.
func inSystemDir(p string) bool {
	for _, d := range systemDirs {
		if within(p, d) {
			return true
		}
	}
	return false
}

// fdTable assigns the descriptors a child gets: ExtraFiles[i] is fd 3+i.
type fdTable struct{ files []*os.File }

func (t *fdTable) add(f *os.File) int {
	t.files = append(t.files, f)
	return 2 + len(t.files)
}

// writeEtc writes the generated files of /etc and the empty file and
// directory that hide private paths into the run directory.
func writeEtc(dir string) error {
	files := map[string]string{
		"passwd": fmt.Sprintf("root:x:0:0:root:/:/usr/sbin/nologin\npal:x:%d:%d:PAL process:%s:/bin/sh\n"+
			"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", sandboxUID, sandboxUID, WorkDir),
		"group":      fmt.Sprintf("root:x:0:\npal:x:%d:\nnogroup:x:65534:\n", sandboxUID),
		"hosts":      "127.0.0.1 localhost pal\n::1 localhost\n",
		"empty-file": "",
	}
	if err := os.Mkdir(filepath.Join(dir, "etc"), 0o755); err != nil {
		return err
	}
	for name, content := range files {
		p := filepath.Join(dir, "etc", name)
		if name == "empty-file" {
			p = filepath.Join(dir, name)
		}
		if err := os.WriteFile(p, []byte(content), 0o444); err != nil {
			return err
		}
	}
	return os.Mkdir(filepath.Join(dir, "empty"), 0o555)
}

// bwrapArgs returns bwrap's arguments for p;
// inner is the init's configuration.
func (p *Process) bwrapArgs(inner innerConfig) ([]string, error) {
	r, spec := p.r, p.spec
	a := []string{"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net",
		"--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--new-session",
		"--uid", strconv.Itoa(sandboxUID), "--gid", strconv.Itoa(sandboxUID), "--hostname", "pal"}
	for _, d := range systemDirs {
		st, err := os.Lstat(d)
		switch {
		case err != nil:
		case st.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(d)
			if err != nil {
				return nil, err
			}
			a = append(a, "--symlink", target, d)
		case st.IsDir():
			a = append(a, "--ro-bind", d, d)
		}
	}
	size := strconv.FormatInt(spec.Limits.Disk, 10)
	a = append(a, "--proc", "/proc", "--dev", "/dev",
		"--size", size, "--tmpfs", "/dev/shm", "--size", size, "--tmpfs", WorkDir, "--size", size, "--tmpfs", "/tmp")
	for _, f := range etcFiles {
		a = append(a, "--ro-bind-try", "/etc/"+f, "/etc/"+f)
	}
	for _, f := range []string{"passwd", "group", "hosts"} {
		a = append(a, "--ro-bind", filepath.Join(p.runDir, "etc", f), "/etc/"+f)
	}
	a = append(a, "--ro-bind", filepath.Join(p.runDir, "ipc"), IPCDir)
	a = append(a, "--ro-bind", r.initBin, InitPath)
	for _, m := range r.cfg.Mounts {
		flag := "--ro-bind"
		if m.Writable {
			flag = "--bind"
		}
		a = append(a, flag, m.Host, m.Path)
		a = append(a, p.masks(m)...)
	}
	if prog := spec.Argv[0]; !inSystemDir(prog) && !r.mounted(prog) {
		src, err := p.reachable(prog, filepath.Join(p.runDir, "program"))
		if err != nil {
			return nil, fmt.Errorf("the program %s: %w", prog, err)
		}
		a = append(a, "--ro-bind", src, prog)
	}
	dir := spec.Dir
	if !filepath.IsAbs(dir) {
		dir = filepath.Join(WorkDir, dir)
	}
	cfg, err := json.Marshal(inner)
	if err != nil {
		return nil, err
	}
	a = append(a, "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", dir, "--", InitPath, string(cfg))
	return append(a, spec.Argv...), nil
}

// masks hides the private paths under mount m.
func (p *Process) masks(m Mount) []string {
	real := realPath(m.Host)
	var a []string
	for _, priv := range p.r.cfg.Private {
		if !within(priv, real) {
			continue
		}
		st, err := os.Stat(priv)
		if err != nil {
			continue // nothing there to hide
		}
		target := filepath.Join(m.Path, strings.TrimPrefix(priv, real))
		src := filepath.Join(p.runDir, "empty")
		if !st.IsDir() {
			src = filepath.Join(p.runDir, "empty-file")
		}
		a = append(a, "--ro-bind", src, target)
	}
	return a
}

// searchable reports whether a uid that is neither owner nor group of
// any of p's directories may walk to p: bwrap, which makes the binds as
// the sandbox's uid, resolves every source path.
func searchable(p string) bool {
	for d := filepath.Dir(p); ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		if err != nil || st.Mode().Perm()&0o001 == 0 {
			return false
		}
		if d == "/" {
			return true
		}
	}
}

// reachable returns a path of file p that the sandbox's uid can reach: p
// itself, or else a hard link (or, across filesystems, a copy) at dst.
func (p *Process) reachable(file, dst string) (string, error) {
	if p.uid < 0 || searchable(file) {
		return file, nil
	}
	if err := linkOrCopy(file, dst); err != nil {
		return "", err
	}
	return dst, nil
}

// linkOrCopy makes dst a hard link of src, or a copy of it.
func linkOrCopy(src, dst string) error {
	real, err := filepath.EvalSymlinks(src)
	if err != nil {
		return err
	}
	if os.Link(real, dst) == nil {
		return nil
	}
	in, err := os.Open(real)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
