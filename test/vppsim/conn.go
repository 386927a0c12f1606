package vppsim

import (
	"bufio"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/codec"
)

// frameHeaderLen is VPP's socket frame header: 8 bytes of queue pointer,
// a big-endian u32 payload length, 4 bytes of timestamp. Only the length
// matters; the rest is ignored on read and zero on write.
const frameHeaderLen = 16

// eventWriteTimeout bounds an event write to a client that does not read;
// the client is dropped when it passes.
const eventWriteTimeout = 5 * time.Second

// conn is one client connection. One goroutine (serve) reads and processes
// its messages in order; events from other goroutines share the writer.
type conn struct {
	s  *Sim
	nc net.Conn
	r  *bufio.Reader

	// Owned by the serve goroutine.
	index       uint32 // client index after sockclnt_create; 0 before
	hangUpAfter int
	received    int
	closing     bool // sockclnt_delete: close once the reply is out
	replyLost   bool // Faults.HangUpOn fired: no reply goes out, the connection is closing

	done     chan struct{} // closed by kill
	killOnce sync.Once

	wmu  sync.Mutex // guards w and hdr
	w    *bufio.Writer
	hdr  [frameHeaderLen]byte
	werr error // first write error; the connection is dead after it
}

func (s *Sim) newConn(nc net.Conn) *conn {
	return &conn{
		s:           s,
		nc:          nc,
		r:           bufio.NewReaderSize(nc, 64<<10),
		w:           bufio.NewWriterSize(nc, 64<<10),
		hangUpAfter: s.faults.Load().HangUpAfter,
		done:        make(chan struct{}),
	}
}

// kill closes the connection from another goroutine and interrupts a
// ReplyDelay sleep, so that Close and Restart never wait for a slow reply.
func (c *conn) kill() {
	c.killOnce.Do(func() {
		close(c.done)
		_ = c.nc.Close()
	})
}

// serve reads frames until EOF or error, processing each in order. Replies
// are buffered and flushed whenever no complete frame is waiting in the read
// buffer, so pipelined requests get batched replies.
func (c *conn) serve() {
	defer c.cleanup()
	var hdr [frameHeaderLen]byte
	buf := make([]byte, 4096)
	for {
		if !c.frameBuffered() {
			if err := c.flush(); err != nil {
				return
			}
		}
		if !c.waitThawed() {
			return
		}
		if _, err := io.ReadFull(c.r, hdr[:]); err != nil {
			c.logEnd(err)
			return
		}
		n := binary.BigEndian.Uint32(hdr[8:12])
		if n > maxFrame {
			c.s.log.Warn("vppsim: frame too long, closing connection", "len", n)
			return
		}
		if int(n) > cap(buf) {
			buf = make([]byte, n)
		}
		payload := buf[:n]
		if _, err := io.ReadFull(c.r, payload); err != nil {
			c.logEnd(err)
			return
		}
		c.received++
		c.handle(payload)
		if c.closing || (c.hangUpAfter > 0 && c.received >= c.hangUpAfter) {
			_ = c.flush()
			return
		}
	}
}

// waitThawed waits while the Frozen fault is on, having flushed what was answered; false when the
// connection is killed meanwhile.
func (c *conn) waitThawed() bool {
	if !c.s.faults.Load().Frozen {
		return true
	}
	if err := c.flush(); err != nil {
		return false
	}
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for c.s.faults.Load().Frozen {
		select {
		case <-t.C:
		case <-c.done:
			return false
		}
	}
	return true
}

func (c *conn) logEnd(err error) {
	if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
		c.s.log.Debug("vppsim: connection read failed", "err", err)
	}
}

// frameBuffered reports whether a whole frame is already in the read buffer.
func (c *conn) frameBuffered() bool {
	b := c.r.Buffered()
	if b < frameHeaderLen {
		return false
	}
	h, err := c.r.Peek(frameHeaderLen)
	if err != nil {
		return false
	}
	return b >= frameHeaderLen+int(binary.BigEndian.Uint32(h[8:12]))
}

// cleanup forgets the client (and its event registration) and closes.
func (c *conn) cleanup() {
	_ = c.nc.Close()
	c.s.mu.Lock()
	if c.index != 0 && c.s.clients[c.index] == c {
		delete(c.s.clients, c.index)
		delete(c.s.eventRegs, c.index)
		delete(c.s.bfdEventRegs, c.index)
	}
	c.s.mu.Unlock()
}

// handle decodes one payload by the declared shape of its message and
// dispatches it. Unknown ids, short headers, undecodable bodies and requests
// with a client_index other than this connection's are dropped without a
// reply, as VPP drops them.
func (c *conn) handle(p []byte) {
	if len(p) < 2 {
		return
	}
	id := binary.BigEndian.Uint16(p)
	mi := c.s.table.lookup(id)
	if mi == nil {
		c.s.log.Debug("vppsim: unknown message id", "id", id)
		return
	}
	var ctx, client uint32
	switch mi.shape {
	case api.RequestMessage:
		if len(p) < 10 {
			return
		}
		client = binary.BigEndian.Uint32(p[2:6])
		ctx = binary.BigEndian.Uint32(p[6:10])
	case api.ReplyMessage:
		if len(p) < 6 {
			return
		}
		ctx = binary.BigEndian.Uint32(p[2:6])
	case api.EventMessage:
		if len(p) < 6 {
			return
		}
		client = binary.BigEndian.Uint32(p[2:6])
	}
	var msg api.Message
	if mi.safe {
		msg = mi.newMsg()
		if err := codec.DefaultCodec.DecodeMsg(p, msg); err != nil {
			c.s.log.Debug("vppsim: undecodable message", "name", mi.name, "err", err)
			msg = nil
		}
	}
	c.s.logRequest(client, mi.name, msg)
	if mi.handler == nil || msg == nil {
		return
	}
	if mi.shape == api.RequestMessage && (c.index == 0 || client != c.index) {
		c.s.log.Debug("vppsim: unknown client_index", "name", mi.name, "client_index", client)
		return
	}
	if d := c.s.faults.Load().ReplyDelay; d > 0 {
		if err := c.flush(); err != nil {
			return
		}
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-c.done:
			t.Stop()
			return
		}
	}
	if f := c.s.faults.Load(); f.HangUpOn != "" && f.HangUpOn == mi.name {
		cleared := *f
		cleared.HangUpOn = ""
		if c.s.faults.CompareAndSwap(f, &cleared) {
			c.replyLost = true
			mi.handler(c.s, c, ctx, msg)
			_ = c.nc.Close()
			return
		}
	}
	mi.handler(c.s, c, ctx, msg)
}

// reply sends a reply to the request with context ctx, unless NoReply.
func (c *conn) reply(ctx uint32, msg api.Message) {
	if c.s.faults.Load().NoReply || c.replyLost {
		return
	}
	c.send(msg, ctx)
}

// send writes msg with ctx in its context field into the write buffer.
func (c *conn) send(msg api.Message, ctx uint32) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.writeLocked(msg, ctx, c.index)
}

// sendEvent writes an event and flushes it; it is called from goroutines
// other than serve, so the write is bounded by a deadline.
func (c *conn) sendEvent(msg api.Message, clientIndex uint32) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.writeLocked(msg, 0, clientIndex)
	if c.werr != nil {
		return
	}
	_ = c.nc.SetWriteDeadline(time.Now().Add(eventWriteTimeout))
	if err := c.w.Flush(); err != nil {
		c.werr = err
		_ = c.nc.Close()
	}
	_ = c.nc.SetWriteDeadline(time.Time{})
}

// writeLocked encodes msg with GoVPP's codec and fills the header fields of
// its declared shape: context for reply-shaped, client_index and context for
// request-shaped, client_index for event-shaped messages.
func (c *conn) writeLocked(msg api.Message, ctx, clientIndex uint32) {
	if c.werr != nil {
		return
	}
	mi := c.s.table.byName[msg.GetMessageName()]
	if mi == nil {
		c.s.log.Error("vppsim: reply message not in table", "name", msg.GetMessageName())
		return
	}
	data, err := codec.DefaultCodec.EncodeMsg(msg, mi.id)
	if err != nil {
		c.s.log.Error("vppsim: encode failed", "name", mi.name, "err", err)
		return
	}
	switch mi.shape {
	case api.ReplyMessage:
		binary.BigEndian.PutUint32(data[2:6], ctx)
	case api.RequestMessage:
		binary.BigEndian.PutUint32(data[2:6], clientIndex)
		binary.BigEndian.PutUint32(data[6:10], ctx)
	case api.EventMessage:
		binary.BigEndian.PutUint32(data[2:6], clientIndex)
	}
	if len(data) < 6 {
		// GoVPP reads a 6-byte reply header from every frame and panics on
		// less; never send one.
		data = append(data, make([]byte, 6-len(data))...)
	}
	binary.BigEndian.PutUint32(c.hdr[8:12], uint32(len(data)))
	if _, err := c.w.Write(c.hdr[:]); err != nil {
		c.werr = err
		return
	}
	if _, err := c.w.Write(data); err != nil {
		c.werr = err
	}
}

func (c *conn) flush() error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.werr != nil {
		return c.werr
	}
	if c.w.Buffered() == 0 {
		return nil
	}
	if err := c.w.Flush(); err != nil {
		c.werr = err
	}
	return c.werr
}
