// Package ipamd is block-ipam's node daemon: it serves the CNI shim's requests (package cni) over a
// unix socket and owns the node's allocation state on one long-lived etcd client.
//
// One direction of flow. The socket's handlers decode each call (cni.Decode), queue its request and
// render the reply (server.go); one goroutine, the state loop, owns the node state (state.go), which
// followers (watch.go) keep up to date from etcd watches: the IPAM config, pools, IPReservations, the
// node's Calico Node resource, its affinities and their blocks; lag.go states why deciding on it is
// safe although it may lag behind etcd. The loop runs the queued requests in batches (batch.go): an ADD with the ADDs queued behind
// it, a DEL with the DELs, never out of order for one container. Each attempt of a batch takes pure
// decisions (add.go, del.go, check.go; gc.go and status.go alike) on a copy-on-write view of the
// state (view.go), reading first only what the view lacks, and sends what they decided as one
// conditional transaction (call.go); what committed is applied to the state. In steady state an ADD
// or a DEL is that one transaction, with no read, and serves the requests queued behind it. Every
// write stays conditional on etcd's revisions (other nodes, calico-ipam and calicoctl write the same
// keys), and a lost race reads the current state in the same round trip, so a daemon killed at any
// point leaves etcd consistent, and two daemons of one node would still hand out no address twice.
package ipamd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/connectivity"

	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/backoff"
	"github.com/vpp-route-agent/vpp-route-agent/internal/liveness"
)

// Limits of the daemon.
const (
	// maxBatch bounds the jobs the state loop takes in one turn (a batch's write serves the ADDs, or
	// the DELs, among them).
	maxBatch = 64
	// MaxTimeout bounds one operation, whatever the shim asks for.
	MaxTimeout = 5 * time.Minute
	// queueLength bounds the requests waiting for the state loop; more are refused with 11.
	queueLength = 1024
)

// Server is the node daemon.
type Server struct {
	cfg     Config
	etcd    *etcdClient
	log     *slog.Logger
	metrics *metrics
	jobs    chan *job
	updates chan update
	// state is the node state; only the state loop touches it.
	state     *nodeState
	followers followers

	// live marks the loop's turns (at least every second when idle) and the deadline of the operation
	// it runs: /healthz and the watchdog.
	live liveness.Loop
	// synced: the state has read every source once (/readyz, Synced).
	synced atomic.Bool
	// socket is the socket Serve answers on, when Listen made it: /readyz checks that its path is
	// still this daemon's.
	socket atomic.Pointer[Socket]
	limits *connLimits
	// exclude are the ipam.exclude ranges of the last valid ADD: the CNI configuration's, which only
	// the requests carry (Exclude, for the capacity gauges).
	exclude atomic.Pointer[[]netip.Prefix]
}

// Exclude returns the ipam.exclude ranges of the last valid ADD this daemon served (nil before the
// first): the node's CNI network configuration, which the requests carry and etcd does not.
func (s *Server) Exclude() []netip.Prefix {
	if p := s.exclude.Load(); p != nil {
		return *p
	}
	return nil
}

// job is one request queued for the state loop; done receives exactly one reply.
type job struct {
	req   *cni.Request
	start time.Time
	// ctx ends when the plugin hangs up: a job not started is dropped, a running one stops before
	// its next transaction.
	ctx  context.Context
	gc   *gcSnapshot
	done chan *cni.Reply
	// answered: done has its reply (finish).
	answered bool
}

// New returns a daemon; Run starts its state loop and Serve answers a listener.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	updates := make(chan update, 256)
	m := newMetrics(cfg.Registerer)
	return &Server{
		cfg:       cfg,
		etcd:      &etcdClient{kv: cfg.Client, callTimeout: cfg.CallTimeout},
		log:       cfg.Logger,
		metrics:   m,
		limits:    newConnLimits(cfg.MaxConnections, cfg.MaxRequestBytes, m),
		jobs:      make(chan *job, queueLength),
		updates:   updates,
		state:     newNodeState(cfg.Node, cfg.Logger),
		followers: followers{f: follower{cli: cfg.Client, timeout: cfg.CallTimeout, log: cfg.Logger, out: updates}},
	}, nil
}

// Run runs the state loop and the followers that feed it until ctx is done.
func (s *Server) Run(ctx context.Context) error {
	s.followers.start(ctx, s.state)
	defer s.followers.wait()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		s.live.Turn()
		s.synced.Store(s.state.synced())
		var first *job
		select {
		case <-ctx.Done():
			return nil
		case u := <-s.updates:
			s.apply(ctx, u)
			continue
		case <-tick.C:
			continue
		case first = <-s.jobs:
		}
		// Decide on everything the followers have delivered.
	updates:
		for {
			select {
			case u := <-s.updates:
				s.apply(ctx, u)
			default:
				break updates
			}
		}
		batch := []*job{first}
	drain:
		for len(batch) < maxBatch {
			select {
			case j := <-s.jobs:
				batch = append(batch, j)
			default:
				break drain
			}
		}
		s.runJobs(ctx, batch)
		s.followers.reconcile(ctx, s.state)
	}
}

// apply hands a follower's update to the state, and follows the blocks of the affinities it has.
func (s *Server) apply(ctx context.Context, u update) {
	s.state.apply(u)
	if !u.block.IsValid() && u.src == srcAffinity {
		s.followers.reconcile(ctx, s.state)
	}
}

// Synced reports whether the node state has been read in full once (after that, operations in steady
// state need no read).
func (s *Server) Synced() bool { return s.synced.Load() }

// HealthyWithin reports whether the state loop has turned within d, or runs an operation whose
// deadline has not passed by d: it does not depend on etcd being reachable.
func (s *Server) HealthyWithin(d time.Duration) bool { return s.live.HealthyWithin(d) }

// runJobs runs the jobs the state loop took, in order. Each leads a batch (see call.serve) with the
// jobs after it that its transaction may serve (batchKey): an automatic ADD the compatible ADDs, a
// DEL the DELs. A job is taken along only if no job before it, taken or not, is of its container:
// those run first. Those its batch served are answered; the others run in their turn.
func (s *Server) runJobs(ctx context.Context, jobs []*job) {
	for i, j := range jobs {
		if j.answered {
			continue
		}
		if err := j.ctx.Err(); err != nil {
			// The plugin hung up before its turn: nobody waits for the answer.
			s.finish(j, &cni.Reply{Code: types.ErrTryAgainLater, Msg: "the plugin hung up before its request ran"})
			continue
		}
		reqs := []*request{s.newRequest(j)}
		if key, ok := batchKey(j.req); ok {
			containers := []string{reqs[0].handle}
			for _, o := range jobs[i+1:] {
				if o.answered {
					continue
				}
				h := handleID(o.req.Network, o.req.ContainerID)
				okey, ok := batchKey(o.req)
				seen := slices.Contains(containers, h)
				containers = append(containers, h)
				if ok && okey == key && !seen && o.ctx.Err() == nil {
					reqs = append(reqs, s.newRequest(o))
				}
			}
		}
		s.finish(j, s.operate(ctx, reqs))
		for _, r := range reqs[1:] {
			if r.served {
				s.answer(r)
			}
		}
	}
}

// answer replies to a request behind a batch's leader that the batch served, once.
func (s *Server) answer(r *request) {
	if !r.job.answered {
		s.finish(r.job, r.reply())
	}
}

// batchKey says whether a request can be served by another's write, and with which: an ADD with an
// ADD of automatic assignment with the same network and allocation settings; a DEL with any DEL (a
// release depends on nothing of the request but its handle and interface).
func batchKey(r *cni.Request) (string, bool) {
	switch {
	case r.Verb == "DEL":
		return "DEL", true
	case r.Verb != "ADD" || len(r.RequestedIPs) > 0:
		return "", false
	}
	return fmt.Sprintf("%s|%v|%v|%v|%d", r.Network, r.Pools, r.Exclude, r.Assign, r.MaxBlocks), true
}

// newRequest returns a job as a request of a batch.
func (s *Server) newRequest(j *job) *request {
	r := &request{job: j, deadline: deadline(j.req, j.start), handle: handleID(j.req.Network, j.req.ContainerID), ifname: j.req.IfName}
	if j.req.Verb == "ADD" {
		r.attr = attribute(j.req, r.handle, r.ifname)
	}
	return r
}

// operate runs the operation of a batch's leader, reqs[0], on the state loop, and returns its reply.
func (s *Server) operate(ctx context.Context, reqs []*request) *cni.Reply {
	lead := reqs[0]
	req := lead.job.req
	// End at the request's deadline, and at once when the plugin hangs up (between transactions:
	// one that was sent is waited for, and applied).
	ctx, cancel := context.WithDeadline(ctx, lead.deadline)
	defer cancel()
	stop := context.AfterFunc(lead.job.ctx, cancel)
	defer stop()
	s.live.Turn()
	defer s.live.Busy(lead.deadline)()
	c := &call{conf: req, etcd: s.etcd, state: s.state, log: s.log.With("verb", req.Verb, "container", req.ContainerID, "ifname", req.IfName, "network", req.Network),
		pause: s.cfg.Pause, endpoints: s.cfg.Endpoints, answer: s.answer, down: s.etcdDown}
	reply := &cni.Reply{}
	var err error
	if down := s.etcdDown(); down != nil && req.Verb != "STATUS" {
		err = down
	} else {
		switch req.Verb {
		case "ADD":
			err = c.serve(ctx, reqs, (*view).add)
			reply.Allocations = lead.allocs
		case "DEL":
			err = c.serve(ctx, reqs, (*view).del)
		case "CHECK":
			err = c.serve(ctx, reqs, (*view).check)
		case "GC":
			reply.Released, err = c.gc(ctx, lead.job.gc)
		case "STATUS":
			lost := s.etcdLost()
			if lost {
				// Try now rather than at the end of gRPC's reconnection backoff, which grows
				// while etcd is down: STATUS has 2 s to tell whether it is back.
				s.cfg.Client.ActiveConnection().ResetConnectBackoff()
			}
			err = c.status(ctx, lost, s.healthProblem())
		}
	}
	// The requests behind the leader its write served; those that failed on their own are not.
	batched := 0
	for _, r := range reqs[1:] {
		switch {
		case !r.served:
		case r.err != nil:
			c.log.Warn(req.Verb+" served by the batch failed", "handle", r.handle, "ifname", r.ifname, "err", r.err)
		default:
			batched++
		}
	}
	reply.RoundTrips, reply.Attempts, reply.Batched = c.roundTrips, c.attempts, batched
	s.metrics.roundTrips.WithLabelValues(req.Verb).Add(float64(c.roundTrips))
	s.metrics.claims.Add(float64(c.claims))
	s.metrics.outside.Add(float64(c.outside))
	s.metrics.batched.WithLabelValues(req.Verb).Add(float64(batched))
	if err != nil {
		if reason := refusalReason(err); reason != "" {
			s.metrics.refused.WithLabelValues(reason).Inc()
		}
		te := toCNIError(err)
		reply.Code, reply.Msg = te.Code, te.Msg
		c.log.Warn(req.Verb+" failed", "err", te.Msg, "code", te.Code, "attempts", c.attempts, "etcd_round_trips", c.roundTrips)
	} else {
		c.log.Debug(req.Verb, "addresses", reply.Allocations, "released", reply.Released, "batched", batched,
			"attempts", c.attempts, "etcd_round_trips", c.roundTrips)
	}
	return reply
}

// Queued returns the number of requests waiting for the state loop.
func (s *Server) Queued() int { return len(s.jobs) }

// etcdLost reports whether the client's connection to etcd has failed (gRPC in transient failure):
// ADD and DEL then fail at once with 11 instead of waiting out their deadline.
func (s *Server) etcdLost() bool {
	conn := s.cfg.Client.ActiveConnection()
	if conn == nil {
		return false
	}
	st := conn.GetState()
	return st == connectivity.TransientFailure || st == connectivity.Shutdown
}

// etcdDown returns why the daemon cannot reach a working etcd now (nil when it may): its connection
// has failed, or etcd does not answer, has no leader or is out of space (Config.EtcdHealth). Requests
// are then answered at once with code 11 and the reason instead of waiting out their deadline.
func (s *Server) etcdDown() error {
	if s.etcdLost() {
		return fmt.Errorf("%w: the daemon has lost its connection to etcd at %s", errUnavailable, s.cfg.Endpoints)
	}
	if p := s.healthProblem(); p != "" {
		return fmt.Errorf("%w: %s", errUnavailable, p)
	}
	return nil
}

// healthProblem is Config.EtcdHealth's problem ("" without one).
func (s *Server) healthProblem() string {
	if s.cfg.EtcdHealth == nil {
		return ""
	}
	return s.cfg.EtcdHealth.Problem()
}

// finish answers a job and records its metrics.
func (s *Server) finish(j *job, r *cni.Reply) {
	r.Node = s.cfg.Node
	result := "ok"
	if r.Code != 0 {
		result = strconv.FormatUint(uint64(r.Code), 10)
	}
	s.metrics.requests.WithLabelValues(j.req.Verb, result).Inc()
	s.metrics.latency.WithLabelValues(j.req.Verb).Observe(time.Since(j.start).Seconds())
	j.answered = true
	if s.cfg.Observe != nil {
		s.cfg.Observe(j.req, r)
	}
	j.done <- r
}

// validate checks what only the daemon knows of a request before it is queued: its node. Every CNI
// rule (command, container ID, interface, network name, cniVersion, each configuration field) was
// checked where the request entered, once (cni.Decode).
func (s *Server) validate(r *cni.Request) *types.Error {
	if r.Node != "" && r.Node != s.cfg.Node {
		return configError("nodename", "the network configuration names node %q, but the block-ipam daemon at this socket serves node %q (its --nodename): remove nodename from the configuration or fix one of them",
			r.Node, s.cfg.Node)
	}
	return nil
}

// Serve answers the shim on l until ctx is done: one request and one reply per connection (see
// package cni). A connection has connTimeout to deliver its request; the reply waits for the
// operation, whose deadline is the request's.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	if sk, ok := l.(*Socket); ok {
		s.socket.Store(sk)
	}
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	// A failed accept (EMFILE in a burst of connections, ...) is waited out, as net/http's Serve
	// does: the daemon serves again once file descriptors are free.
	bo := backoff.Backoff{Base: 5 * time.Millisecond, Max: time.Second}
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("accept on the socket: %w", err)
			}
			s.log.Warn("accepting a connection on the socket; retrying", "err", err)
			if !bo.Wait(ctx) {
				return nil
			}
			continue
		}
		bo.Reset()
		if !s.limits.makeRoom(ctx) {
			conn.Close()
			return nil
		}
		c := s.limits.admit(conn, connTimeout)
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.serveConn(ctx, c)
		}()
	}
}

// connTimeout bounds reading a request and writing a reply: a plugin writes its request at once.
const connTimeout = 5 * time.Second

func (s *Server) serveConn(ctx context.Context, conn *limitedConn) {
	defer s.limits.release(conn)
	defer conn.Close()
	start := time.Now()
	data, size, reserved, err := s.limits.read(conn, cni.MaxMessage+1)
	defer s.limits.unreserve(reserved)
	var out []byte
	switch {
	case errors.Is(err, errBytes):
		// Read the rest into nothing (within the read deadline) before answering: a connection
		// closed with data unread is reset, and the client would get ECONNRESET instead of 11.
		s.metrics.dropped.WithLabelValues("bytes").Inc()
		discard(conn, size, len(data))
		out = cni.RenderError(&types.Error{Code: types.ErrTryAgainLater,
			Msg: fmt.Sprintf("block-ipam daemon: busy: it holds %d bytes of requests being read, its limit; try again later", s.cfg.MaxRequestBytes)})
	case err != nil:
		switch {
		case s.limits.stopReading(conn):
			s.metrics.dropped.WithLabelValues("displaced").Inc()
		case errors.Is(err, os.ErrDeadlineExceeded):
			s.metrics.dropped.WithLabelValues("deadline").Inc()
			s.log.Debug("no whole request on the socket within the deadline", "deadline", connTimeout)
		default:
			s.log.Warn("reading a request from the socket", "err", err)
		}
		return
	case len(data) > cni.MaxMessage:
		if s.limits.stopReading(conn) {
			s.metrics.dropped.WithLabelValues("displaced").Inc()
			return
		}
		discard(conn, size, len(data))
		_, err := cni.Decode(data)
		out = cni.RenderError(err)
	default:
		s.limits.doneReading(conn)
		jctx, cancel := context.WithCancel(ctx)
		defer cancel()
		// The request is read whole, and the plugin keeps its side open until it gets the reply:
		// a read now returns only when the plugin hangs up (or sends more than its frame, which it
		// must not), and then the request is given up. One goroutine blocked in that read, as
		// net/http's connReader.backgroundRead; a read deadline in the past ends it.
		conn.SetReadDeadline(time.Time{})
		read := make(chan struct{})
		go func() {
			defer close(read)
			var b [1]byte
			if _, err := conn.Read(b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
				cancel()
			}
		}()
		out = s.serveCall(jctx, start, data)
		conn.SetReadDeadline(time.Unix(1, 0))
		<-read
	}
	conn.SetWriteDeadline(time.Now().Add(connTimeout))
	conn.Write(out)
}

// serveCall is the daemon's request path: decode the plugin's call (package cni checks every CNI rule
// there, once), serve its request, render the reply; ctx ends when the plugin hangs up.
func (s *Server) serveCall(ctx context.Context, start time.Time, frame []byte) (out []byte) {
	defer func() {
		if r := recover(); r != nil {
			s.log.Error("panic serving a call", "panic", r, "stack", string(debug.Stack()))
			out = cni.RenderError(&types.Error{Code: types.ErrInternal, Msg: fmt.Sprintf("block-ipam daemon: internal error: %v", r)})
		}
	}()
	call, err := cni.Decode(frame)
	if err != nil {
		return cni.RenderError(err)
	}
	return call.Render(s.serve(ctx, start, call.Request()))
}

// discard reads the rest of a request the daemon refuses, so that closing does not reset the
// connection before the client reads the reply: to the end its length gives (size, of which have
// bytes were read), or to the end of the stream when it gave none.
func discard(conn net.Conn, size, have int) {
	if size >= 0 {
		io.CopyN(io.Discard, conn, int64(size-have))
		return
	}
	io.Copy(io.Discard, conn)
}

// deadline is when the daemon gives up on a request: a little before the shim does, so that it
// gets the reason rather than a deadline. The request's timeout is the configuration's, read once
// (shim.CallTimeout, through cni.Decode), at most MaxTimeout.
func deadline(r *cni.Request, start time.Time) time.Time {
	return start.Add(min(r.Timeout, MaxTimeout) * 9 / 10)
}

// serve answers one decoded request; ctx ends when the plugin hangs up or the daemon stops.
func (s *Server) serve(ctx context.Context, start time.Time, req *cni.Request) *cni.Reply {
	j := &job{req: req, start: start, ctx: ctx, done: make(chan *cni.Reply, 1)}
	if err := s.validate(req); err != nil {
		s.finish(j, &cni.Reply{Code: err.Code, Msg: err.Msg})
		return <-j.done
	}
	// From here on, the request is the daemon's node's (the allocator's conf.Node).
	req.Node = s.cfg.Node
	if req.Verb == "ADD" {
		ex := slices.Clone(req.Exclude)
		s.exclude.Store(&ex)
	}
	if p := s.healthProblem(); p != "" {
		// etcd is known not to serve: answer now rather than queue behind operations that wait on it.
		code := uint(types.ErrTryAgainLater)
		if req.Verb == "STATUS" {
			code = ErrPluginNotAvailable
		}
		s.finish(j, &cni.Reply{Code: code, Msg: p})
		return <-j.done
	}
	if req.Verb == "GC" {
		// The snapshot of every block is read here, off the state loop; the loop decides on it.
		// It has at most half of the request's time, so that the releases keep the other half.
		end := deadline(req, start)
		sctx, cancel := context.WithDeadline(ctx, start.Add(end.Sub(start)/2))
		snap, err := snapshotGC(sctx, s.etcd, req)
		cancel()
		if err != nil {
			te := toCNIError(err)
			s.finish(j, &cni.Reply{Code: te.Code, Msg: te.Msg, RoundTrips: snap.roundTrips, Attempts: 1})
			return <-j.done
		}
		j.gc = snap
	}
	select {
	case s.jobs <- j:
	default:
		s.finish(j, &cni.Reply{Code: types.ErrTryAgainLater, Msg: fmt.Sprintf("the daemon has %d requests queued; try again later", queueLength)})
		return <-j.done
	}
	select {
	case r := <-j.done:
		return r
	case <-ctx.Done():
		// The plugin hung up, or the daemon stops; the state loop still answers into the buffered
		// channel if it gets there.
		return &cni.Reply{Node: s.cfg.Node, Code: types.ErrTryAgainLater, Msg: "the block-ipam daemon is stopping"}
	}
}

// health answers /healthz (the state loop is alive: HealthyWithin) and /readyz (and its etcd
// connection is not failing, its socket's path still names its socket, and the node state has been
// read).
func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if !s.HealthyWithin(s.cfg.HealthWindow) {
		http.Error(w, "the state loop is stalled", http.StatusServiceUnavailable)
		return
	}
	if r.URL.Path == "/readyz" && s.etcdLost() {
		http.Error(w, "etcd unreachable at "+s.cfg.Endpoints, http.StatusServiceUnavailable)
		return
	}
	if p := s.healthProblem(); r.URL.Path == "/readyz" && p != "" {
		http.Error(w, p, http.StatusServiceUnavailable)
		return
	}
	if sk := s.socket.Load(); r.URL.Path == "/readyz" && sk != nil {
		if err := sk.Check(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	if r.URL.Path == "/readyz" && !s.Synced() {
		http.Error(w, "the node's IPAM state has not been read from etcd at "+s.cfg.Endpoints+" yet", http.StatusServiceUnavailable)
		return
	}
	fmt.Fprintln(w, "ok")
}

// HealthHandler serves /healthz, /readyz and /metrics (from gatherer) for the metrics listener.
func (s *Server) HealthHandler(gatherer prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", s.health)
	mux.HandleFunc("/readyz", s.health)
	mux.Handle("/metrics", promhttpHandler(gatherer))
	return mux
}
