package ipamd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
)

// Socket is the daemon's listening unix socket. It knows its file by inode: closing it removes the path
// only while the path still names this socket, and Check tells whether it does.
type Socket struct {
	*net.UnixListener
	path     string
	dev, ino uint64
	once     sync.Once
	closeErr error
}

// Close removes the socket's path if it is still this socket, then stops listening; more calls do
// nothing. The path is checked while the socket still listens: a successor cannot have taken it over
// (Listen refuses a live socket), and the inode cannot have been reused. So a daemon that stops and
// drains its connections while a new daemon starts on the same path (a rolling or a systemd restart)
// never removes the new daemon's socket.
func (s *Socket) Close() error {
	s.once.Do(func() {
		if s.Check() == nil {
			os.Remove(s.path)
		}
		s.closeErr = s.UnixListener.Close()
	})
	return s.closeErr
}

// Check returns nil while the socket's path names this socket, else why the plugin cannot reach the
// daemon there (removed, or replaced by another file).
func (s *Socket) Check() error {
	st, err := os.Lstat(s.path)
	if err != nil {
		return fmt.Errorf("the socket %s is gone: %w", s.path, err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); !ok || uint64(sys.Dev) != s.dev || sys.Ino != s.ino {
		return fmt.Errorf("the socket %s was replaced by another file: the plugin no longer reaches this daemon", s.path)
	}
	return nil
}

// Listen creates the daemon's unix socket at path, readable and writable by its owner only (0600):
// root, i.e. the runtime executing the plugin, connects whoever the owner is. A missing directory is
// created 0700. A socket left by a daemon that died is replaced; one a live daemon answers on is an
// error, so that a second daemon of the node does not steal the first one's socket. It needs no
// privilege and no chown: the shipped systemd unit forbids both.
func Listen(path string) (*Socket, error) {
	if why := shim.CheckSocketPath(path); why != "" {
		return nil, fmt.Errorf("--socket %s", why)
	}
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("--socket: create %s: %w", dir, err)
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
	ul, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("--socket: %w", err)
	}
	// Go's close would unlink the path whoever's socket it names by then: Close decides.
	ul.SetUnlinkOnClose(false)
	l := &Socket{UnixListener: ul, path: path}
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		ul.Close()
		return nil, fmt.Errorf("--socket: %w", err)
	}
	l.dev, l.ino = uint64(st.Dev), st.Ino
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("--socket: chmod %s: %w", path, err)
	}
	return l, nil
}
