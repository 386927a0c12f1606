package ipamd

import (
	"context"
	"errors"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// hangups tells waiting requests that their plugin gave up. The plugin half-closes its side of the
// connection after its request (which reads as EOF, so reading cannot tell), and closes it when it
// gives up, which a unix socket reports as EPOLLHUP. One goroutine waits in epoll(7) for that on every
// waiting connection and cancels the request: nothing runs while nobody hangs up.
type hangups struct {
	epfd int
	mu   sync.Mutex
	next int32
	// cancels are the waiting connections' cancel functions, by the token epoll reports.
	cancels map[int32]func()
}

func newHangups() (*hangups, error) {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	return &hangups{epfd: fd, cancels: map[int32]func(){}}, nil
}

// run waits for hang-ups until ctx is done (within hangupPoll). The caller closes epfd after it.
func (h *hangups) run(ctx context.Context) {
	events := make([]unix.EpollEvent, 64)
	for ctx.Err() == nil {
		n, err := unix.EpollWait(h.epfd, events, int(hangupPoll.Milliseconds()))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		h.mu.Lock()
		for _, ev := range events[:n] {
			if cancel := h.cancels[ev.Fd]; cancel != nil {
				delete(h.cancels, ev.Fd)
				cancel()
			}
		}
		h.mu.Unlock()
	}
}

// watch calls cancel when the plugin closes its end of conn, until the returned stop is called
// (before conn is closed: its descriptor may be reused).
func (h *hangups) watch(conn net.Conn, cancel func()) (stop func()) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return func() {}
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return func() {}
	}
	h.mu.Lock()
	h.next++
	token := h.next
	h.cancels[token] = cancel
	h.mu.Unlock()
	added := false
	rc.Control(func(fd uintptr) {
		// One-shot: reported once, not again and again until stop.
		ev := unix.EpollEvent{Events: unix.EPOLLHUP | unix.EPOLLERR | unix.EPOLLONESHOT, Fd: token}
		added = unix.EpollCtl(h.epfd, unix.EPOLL_CTL_ADD, int(fd), &ev) == nil
	})
	return func() {
		if added {
			rc.Control(func(fd uintptr) { unix.EpollCtl(h.epfd, unix.EPOLL_CTL_DEL, int(fd), nil) })
		}
		h.mu.Lock()
		delete(h.cancels, token)
		h.mu.Unlock()
	}
}
