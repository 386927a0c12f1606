package cni

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// nodeLock is an exclusive flock(2) on a per-node file that serialises block-ipam's own processes on
// a node (calico-ipam holds a host-wide lock the same way). It only spares them from racing each
// other for the same block: every write is a conditional transaction, so two writers without the
// lock (or on different nodes) stay correct and merely retry. The kernel releases the lock when the
// process dies, so a killed plugin never blocks the next.
type nodeLock struct{ f *os.File }

// acquireLock blocks until the lock at path is held or ctx ends. path "" gives a no-op lock.
func acquireLock(ctx context.Context, path string) (*nodeLock, error) {
	if path == "" {
		return &nodeLock{}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("lock directory for %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open lock %s: %w", path, err)
	}
	done := make(chan error, 1)
	go func() {
		for {
			err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
			if err != syscall.EINTR {
				done <- err
				return
			}
		}
	}()
	select {
	case err := <-done:
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		return &nodeLock{f: f}, nil
	case <-ctx.Done():
		// The flock call may still succeed later: release the file then, not now.
		go func() {
			<-done
			f.Close()
		}()
		return nil, fmt.Errorf("waiting for lock %s: %w", path, ctx.Err())
	}
}

// release unlocks (closing the file drops the flock).
func (l *nodeLock) release() {
	if l != nil && l.f != nil {
		l.f.Close()
		l.f = nil
	}
}
