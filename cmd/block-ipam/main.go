// Command block-ipam is the CNI IPAM plugin that allocates pod addresses from Calico IPAM blocks in
// etcd, through the node's block-ipam daemon; see package cni. `block-ipam daemon` runs the daemon
// (block-ipamd, installed beside this binary), `block-ipam install` installs the plugin, and
// `block-ipam release-node NODE` gives a dead node's addresses back (run by block-ipamd).
package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
	"github.com/vpp-route-agent/vpp-route-agent/internal/buildinfo"
)

// daemonBinary is the daemon's own binary. The plugin the runtime executes for every pod must not link
// the etcd client: that alone makes a Go binary take 5.4 ms to start instead of 1.8 ms here.
const daemonBinary = "block-ipamd"

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "install":
			runInstall()
		case "daemon":
			runDaemon(os.Args[2:])
		case "release-node":
			// An operator command on etcd: the daemon's binary, which links the etcd client, runs it.
			runDaemon(os.Args[1:])
		}
	}
	os.Exit(shim.Main("CNI block-ipam " + buildinfo.Version))
}

// runDaemon replaces this process with block-ipamd run with args (same PID, so systemd's notify
// socket and the container runtime see the daemon itself), found beside this binary or on PATH.
func runDaemon(args []string) {
	path := daemonBinary
	if self, err := os.Executable(); err == nil {
		if p := filepath.Join(filepath.Dir(self), daemonBinary); fileExists(p) {
			path = p
		}
	}
	if !filepath.IsAbs(path) {
		p, err := exec.LookPath(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "block-ipam %s: %s is neither beside this binary nor on PATH: %v\n", os.Args[1], daemonBinary, err)
			os.Exit(1)
		}
		path = p
	}
	err := syscall.Exec(path, append([]string{path}, args...), os.Environ())
	fmt.Fprintf(os.Stderr, "block-ipam %s: exec %s: %v\n", os.Args[1], path, err)
	os.Exit(1)
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
