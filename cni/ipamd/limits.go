package ipamd

import (
	"container/list"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
)

// Bounds of what the socket's clients may hold of the daemon (Config.MaxConnections,
// Config.MaxRequestBytes).
const (
	// DefaultMaxConnections is the default of Config.MaxConnections: far more than a node's runtime
	// has plugins waiting at once.
	DefaultMaxConnections = 256
	// DefaultMaxRequestBytes is the default of Config.MaxRequestBytes: 16 requests of the largest
	// size at once, besides what every connection may buffer (firstRead).
	DefaultMaxRequestBytes = 16 << 20
	// firstRead is the buffer every connection may fill, outside MaxRequestBytes (a plugin's request
	// is a few KB: real requests never wait for the shared budget); it doubles as a request grows,
	// and what it grows by comes out of MaxRequestBytes.
	firstRead = 8 << 10
	// displaceAge is how long a connection is safe from being displaced after it is accepted: the
	// plugin writes its request right after connecting.
	displaceAge = 10 * time.Millisecond
)

// errBytes: the daemon already buffers Config.MaxRequestBytes of requests.
var errBytes = errors.New("the daemon's request buffers are full")

// connLimits bounds the connections served at once and the request bytes they buffer, as
// netutil.LimitListener and etcd's and net/http's limits do, with one difference: an attacker that
// fills the slots with connections that send nothing (or trickle a request) does not lock real
// plugins out. A plugin writes its whole request at once, right after connecting; so at the limit,
// for a connection just accepted, the daemon closes ("displaces") the oldest one still
// reading its request that has nothing to read: no data and no end pending in the kernel, older
// than displaceAge. A connection whose request is read (waiting for the state loop or its reply) is
// never displaced, nor one whose reader has simply not run yet (the daemon runs on one thread: a
// burst of accepts must not displace a plugin whose request is already there). When no connection
// may be displaced, the new connection waits, unread, and accepting with it (the kernel queues the
// next ones).
type connLimits struct {
	max      int
	maxBytes int64
	// room is signalled when a connection ends or finishes reading.
	room chan struct{}
	m    *metrics

	mu sync.Mutex
	// open counts the connections served, displaced ones excepted.
	open int
	// reading are the open connections still reading their request, oldest first.
	reading list.List
	bytes   int64
}

// limitedConn is one accepted connection under the limits.
type limitedConn struct {
	net.Conn
	admitted time.Time
	// elem is the connection in connLimits.reading; nil once it has read its request, or was displaced.
	elem      *list.Element
	displaced bool
}

func newConnLimits(maxConns int, maxBytes int64, m *metrics) *connLimits {
	return &connLimits{max: maxConns, maxBytes: maxBytes, room: make(chan struct{}, 1), m: m}
}

// makeRoom returns once a connection just accepted may be served (false when ctx ends first): below
// the limit, after displacing a connection if need be.
func (l *connLimits) makeRoom(ctx context.Context) bool {
	var retry *time.Timer
	defer func() {
		if retry != nil {
			retry.Stop()
		}
	}()
	for {
		l.mu.Lock()
		if l.open < l.max {
			l.mu.Unlock()
			return true
		}
		victim := l.victim(time.Now())
		if victim != nil {
			l.unlist(victim)
			victim.displaced = true
			l.open--
			// Its reader's read fails, and it ends (counted then). Set under l.mu: a reader that had
			// read its whole request keeps it (doneReading), and clears the deadline after this.
			victim.Conn.SetReadDeadline(time.Unix(1, 0))
		}
		l.mu.Unlock()
		if victim != nil {
			return true
		}
		if retry == nil {
			retry = time.NewTimer(displaceAge)
		} else {
			retry.Reset(displaceAge)
		}
		select {
		case <-l.room:
		case <-retry.C:
		case <-ctx.Done():
			return false
		}
	}
}

// victim returns the oldest reading connection that may be displaced, or nil; l.mu is held.
func (l *connLimits) victim(now time.Time) *limitedConn {
	for e := l.reading.Front(); e != nil; e = e.Next() {
		c := e.Value.(*limitedConn)
		if now.Sub(c.admitted) < displaceAge {
			return nil // the others are younger
		}
		if !pending(c.Conn) {
			return c
		}
	}
	return nil
}

// pending reports whether conn has data or its end waiting in the kernel: its reader will progress.
func pending(conn net.Conn) bool {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	idle := false
	rc.Control(func(fd uintptr) {
		var b [1]byte
		_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		idle = errors.Is(err, unix.EAGAIN)
	})
	return !idle
}

// admit counts an accepted connection (after makeRoom), which has until timeout to deliver its
// request (set here, before its reader runs: displacing it may move the deadline earlier).
func (l *connLimits) admit(conn net.Conn, timeout time.Duration) *limitedConn {
	c := &limitedConn{Conn: conn, admitted: time.Now()}
	conn.SetReadDeadline(c.admitted.Add(timeout))
	l.mu.Lock()
	l.open++
	c.elem = l.reading.PushBack(c)
	l.mu.Unlock()
	return c
}

// read reads c's request frame, to the end its length gives (size; -1 when data does not begin
// with one: then to the end of the stream), or to limit bytes, buffering beyond firstRead no more
// than the daemon's total allows; reserved is what the buffer holds of that total (release it with
// unreserve). With errBytes, data is what was read.
func (l *connLimits) read(c *limitedConn, limit int) (data []byte, size int, reserved int64, err error) {
	buf := make([]byte, 0, min(firstRead, limit))
	size = -1
	for {
		if size < 0 {
			if n, ok := shim.FrameSize(buf); ok {
				size = n
			}
		}
		if size >= 0 && len(buf) >= size {
			return buf, size, reserved, nil
		}
		if len(buf) == cap(buf) {
			if len(buf) >= limit {
				return buf, size, reserved, nil
			}
			grow := min(cap(buf), limit-cap(buf))
			if !l.reserve(int64(grow)) {
				return buf, size, reserved, errBytes
			}
			reserved += int64(grow)
			nb := make([]byte, len(buf), cap(buf)+grow)
			copy(nb, buf)
			buf = nb
		}
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, size, reserved, nil
		}
		if err != nil {
			return nil, size, reserved, err
		}
	}
}

func (l *connLimits) reserve(n int64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.bytes+n > l.maxBytes {
		return false
	}
	l.bytes += n
	return true
}

func (l *connLimits) unreserve(n int64) {
	l.mu.Lock()
	l.bytes -= n
	l.mu.Unlock()
}

// doneReading marks c's request read whole: from now on it is not displaced. A connection displaced
// after its reader took the last of its request, and before this, is taken back and served (over the
// limit by one for a moment): the victim test sees nothing left to read in the kernel, as of an idle
// connection, since a plugin keeps its side open after its request.
func (l *connLimits) doneReading(c *limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.displaced {
		c.displaced = false
		l.open++
	}
	l.unlist(c)
}

// stopReading ends c's reading without its whole request (a failed read, or one over the limit) and
// reports whether c was displaced.
func (l *connLimits) stopReading(c *limitedConn) (displaced bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unlist(c)
	return c.displaced
}

// unlist takes c off the reading list; l.mu is held.
func (l *connLimits) unlist(c *limitedConn) {
	if c.elem != nil {
		l.reading.Remove(c.elem)
		c.elem = nil
	}
}

// release ends c under the limits.
func (l *connLimits) release(c *limitedConn) {
	l.mu.Lock()
	if !c.displaced {
		l.open--
	}
	l.unlist(c)
	select {
	case l.room <- struct{}{}:
	default:
	}
	l.mu.Unlock()
}
