package ipamd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
)

// Listen creates the daemon's unix socket at path, readable and writable by root only (0600) or, with
// gid >= 0, also by that group (0660). A missing directory is created 0700 (0750 with a group). A
// socket left by a daemon that died is replaced; one a live daemon answers on is an error, so that a
// second daemon of the node does not steal the first one's socket.
func Listen(path string, gid int) (net.Listener, error) {
	if why := shim.CheckSocketPath(path); why != "" {
		return nil, fmt.Errorf("--socket %s", why)
	}
	dir := filepath.Dir(path)
	dirMode, mode := os.FileMode(0o700), os.FileMode(0o600)
	if gid >= 0 {
		dirMode, mode = 0o750, 0o660
	}
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, dirMode); err != nil {
			return nil, fmt.Errorf("--socket: create %s: %w", dir, err)
		}
		if gid >= 0 {
			if err := os.Chown(dir, -1, gid); err != nil {
				return nil, fmt.Errorf("--socket-group: chown %s: %w", dir, err)
			}
		}
	}
	if st, err := os.Lstat(path); err == nil {
		if st.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("--socket %s exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return nil, fmt.Errorf("--socket %s: another block-ipam daemon is listening on it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("--socket: remove the stale socket %s: %w", path, err)
		}
	}
	// No moment with a wider mode: the socket is created under a umask that leaves only the owner.
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	if gid >= 0 {
		if err := os.Chown(path, -1, gid); err != nil {
			l.Close()
			return nil, fmt.Errorf("--socket-group: chown %s: %w", path, err)
		}
	}
	if err := os.Chmod(path, mode); err != nil {
		l.Close()
		return nil, fmt.Errorf("--socket: chmod %s: %w", path, err)
	}
	return l, nil
}
