package etcdtest

import (
	"net"
	"sync"
	"sync/atomic"
)

// Proxy is a TCP proxy in front of an etcd member. Freeze makes it stop forwarding while keeping
// every connection open (a member that hangs without closing its sockets, as a SIGSTOPped process
// or a dead VM does); Block cuts every connection and refuses new ones (a member that is down).
//
// It counts the bytes it carries each way, so that tests can measure a server's traffic on the wire.
type Proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	// Down counts the bytes the target sent its clients (for etcd: gRPC messages with their HTTP/2
	// framing, pings and window updates; not TCP/IP headers), Up the bytes the clients sent it, and
	// Accepted the connections the proxy accepted.
	Down, Up, Accepted atomic.Int64

	mu      sync.Mutex // guards the fields below
	blocked bool
	frozen  bool
	thaw    chan struct{} // closed by Thaw
	conns   map[net.Conn]struct{}
}

// NewProxy listens on a free loopback port and forwards to target (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}, thaw: make(chan struct{})}
	close(p.thaw)
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Endpoint returns the proxy's client URL.
func (p *Proxy) Endpoint() string { return "http://" + p.Addr() }

// Addr returns the proxy's address, host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.Accepted.Add(1)
		p.mu.Lock()
		blocked := p.blocked
		p.mu.Unlock()
		if blocked {
			c.Close()
			continue
		}
		u, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.blocked {
			p.mu.Unlock()
			c.Close()
			u.Close()
			continue
		}
		p.conns[c], p.conns[u] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(c, u, &p.Down)
		go p.pipe(u, c, &p.Up)
	}
}

// pipe copies src to dst, counting into sent, holding each chunk while the proxy is frozen.
func (p *Proxy) pipe(dst, src net.Conn, sent *atomic.Int64) {
	defer p.wg.Done()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			sent.Add(int64(n))
			p.mu.Lock()
			thaw := p.thaw
			p.mu.Unlock()
			<-thaw
			if _, werr := dst.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil { // io.EOF or a closed connection: either way this direction is done
			break
		}
	}
	dst.Close()
	src.Close()
	p.mu.Lock()
	delete(p.conns, dst)
	delete(p.conns, src)
	p.mu.Unlock()
}

// Freeze stops forwarding in both directions; connections stay open and new ones are accepted (and
// hang too) until Thaw.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.frozen {
		p.frozen, p.thaw = true, make(chan struct{})
	}
}

// Thaw resumes forwarding.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.frozen {
		p.frozen = false
		close(p.thaw)
	}
}

// Block cuts every connection and refuses new ones until Unblock.
func (p *Proxy) Block() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = true
	for c := range p.conns {
		c.Close()
	}
}

// Unblock accepts connections again.
func (p *Proxy) Unblock() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.blocked = false
}

// Close stops the proxy and waits for its goroutines.
func (p *Proxy) Close() {
	p.ln.Close()
	p.Thaw()
	p.Block()
	p.wg.Wait()
}
