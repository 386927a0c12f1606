package ipamd

import (
	"container/list"
	"context"
	"errors"
	"io"
	"net"
	"sync"
)

// Bounds of what the socket's clients may hold of the daemon (Config.MaxConnections,
// Config.MaxRequestBytes).
const (
	// DefaultMaxConnections is the default of Config.MaxConnections: far more than a node's runtime
	// has plugins waiting at once (the state loop queues at most queueLength requests).
	DefaultMaxConnections = 256
	// DefaultMaxRequestBytes is the default of Config.MaxRequestBytes: 16 requests of the largest
	// size at once, or thousands of ordinary ones (a few KB each).
	DefaultMaxRequestBytes = 16 << 20
	// firstRead is the buffer every connection may fill, outside MaxRequestBytes (a plugin's request
	// is a few KB: real requests never wait for the shared budget); it doubles as a request grows,
	// and what it grows by comes out of MaxRequestBytes.
	firstRead = 8 << 10
)

// errBytes: the daemon already buffers Config.MaxRequestBytes of requests.
var errBytes = errors.New("the daemon's request buffers are full")

// connLimits bounds the connections served at once and the request bytes they buffer, as
// netutil.LimitListener and etcd's and net/http's limits do, with one difference: an attacker that
// fills the slots with connections that send nothing (or trickle a request) does not lock real
// plugins out. A plugin writes its whole request at once, right after connecting; so at the limit, a
// new connection displaces the one that has waited longest for the rest of its request. Connections
// whose request is read, waiting for the state loop or for their reply, are never displaced; when
// all of them are such, accepting waits until one ends (the kernel queues the others).
type connLimits struct {
	max      int
	maxBytes int64
	// room is signalled when a connection ends or finishes reading.
	room chan struct{}
	m    *metrics

	mu   sync.Mutex
	open int
	// reading are the open connections still reading their request, oldest first; started counts
	// those whose reader has run (which may be displaced).
	reading list.List
	started int
	bytes   int64
}

// limitedConn is one accepted connection under the limits.
type limitedConn struct {
	net.Conn
	// elem is the connection in connLimits.reading; nil once it has read its request, or was displaced.
	elem      *list.Element
	started   bool
	displaced bool
}

func newConnLimits(maxConns int, maxBytes int64, m *metrics) *connLimits {
	return &connLimits{max: maxConns, maxBytes: maxBytes, room: make(chan struct{}, 1), m: m}
}

// wait returns once a connection may be accepted (false when ctx ends first): below the limit, or
// with a connection to displace.
func (l *connLimits) wait(ctx context.Context) bool {
	for {
		l.mu.Lock()
		ok := l.open < l.max || l.started > 0
		l.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-l.room:
		case <-ctx.Done():
			return false
		}
	}
}

// admit counts an accepted connection, displacing the oldest one still reading when over the limit.
func (l *connLimits) admit(conn net.Conn) *limitedConn {
	c := &limitedConn{Conn: conn}
	l.mu.Lock()
	l.open++
	var victim *limitedConn
	if l.open > l.max {
		for e := l.reading.Front(); e != nil; e = e.Next() {
			if v := e.Value.(*limitedConn); v.started {
				victim = v
				l.unlist(v)
				v.displaced = true
				break
			}
		}
	}
	c.elem = l.reading.PushBack(c)
	l.mu.Unlock()
	if victim != nil {
		// Its reader fails and the connection ends (release).
		victim.Conn.Close()
		l.m.dropped.WithLabelValues("displaced").Inc()
	}
	return c
}

// read reads c's request, to its end or to limit bytes, buffering no more than the daemon's total
// allows; reserved is what the buffer holds of that total (release it with unreserve).
func (l *connLimits) read(c *limitedConn, limit int) (data []byte, reserved int64, err error) {
	l.mu.Lock()
	if c.elem != nil {
		c.started = true
		l.started++
		l.signal()
	}
	l.mu.Unlock()
	buf := make([]byte, 0, firstRead)
	for {
		if len(buf) == cap(buf) {
			if len(buf) >= limit {
				return buf, reserved, nil
			}
			grow := min(cap(buf), limit-cap(buf))
			if !l.reserve(int64(grow)) {
				return nil, reserved, errBytes
			}
			reserved += int64(grow)
			nb := make([]byte, len(buf), cap(buf)+grow)
			copy(nb, buf)
			buf = nb
		}
		n, err := c.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, reserved, nil
		}
		if err != nil {
			return nil, reserved, err
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

// doneReading marks c's request read: from now on it is not displaced. It returns false when c was
// displaced meanwhile.
func (l *connLimits) doneReading(c *limitedConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.displaced {
		return false
	}
	l.unlist(c)
	l.signal()
	return true
}

// unlist takes c off the reading list; l.mu is held.
func (l *connLimits) unlist(c *limitedConn) {
	if c.elem == nil {
		return
	}
	l.reading.Remove(c.elem)
	c.elem = nil
	if c.started {
		l.started--
	}
}

// release ends c under the limits.
func (l *connLimits) release(c *limitedConn) {
	l.mu.Lock()
	l.open--
	l.unlist(c)
	l.signal()
	l.mu.Unlock()
}

// signal wakes wait; l.mu is held.
func (l *connLimits) signal() {
	select {
	case l.room <- struct{}{}:
	default:
	}
}
