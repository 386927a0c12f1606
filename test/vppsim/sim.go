// Package vppsim is a VPP binary-API simulator that GoVPP's unmodified
// adapter/socketclient cannot tell from a real VPP: it speaks VPP's framing
// over a unix stream socket, answers the sockclnt_create handshake with a
// message table numbered as VPP numbers it, and reproduces VPP's FIB and
// interface semantics and return codes for the messages a route agent uses.
//
// Every message is encoded and decoded with GoVPP's own binapi types and
// codec. The FIB is shared by all connections of one Sim; each connection is
// processed strictly in order, like VPP's single API thread. Tests drive
// faults (hang-ups, missing replies, stalled pings, slow replies, restarts),
// inject foreign routes and read the FIB and a request log in process; the
// standalone command cmd/vppsim exposes the same over HTTP.
package vppsim

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/fib_types"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip_types"

	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// DefaultInterface is the interface a Sim has when Config.Interfaces is nil.
const DefaultInterface = "GigabitEthernet0/8/0"

// DefaultVersion is the show_version version when Config.Version is empty.
const DefaultVersion = "25.10-release"

// DefaultMaxRequestLog is the number of requests Requests keeps when
// Config.MaxRequestLog is 0.
const DefaultMaxRequestLog = 100000

// maxFrame bounds the payload length the simulator accepts; a longer frame
// closes the connection (VPP would try to allocate it).
const maxFrame = 16 << 20

// Config configures a Sim.
type Config struct {
	// Interfaces are the interface names, sw_if_index 1..N in order; nil
	// means {DefaultInterface}. local0 is always sw_if_index 0.
	Interfaces []string
	// Version is the show_version reply version; "" means DefaultVersion.
	Version string
	// CRCOverrides maps a message name (e.g. "ip_route_add_del") to the
	// 8-hex-digit CRC advertised instead of the real one, to play an older
	// VPP: GoVPP then finds no id for its version of the message.
	CRCOverrides map[string]string
	// Logger receives connection-level logs (Debug for per-message events);
	// nil discards.
	Logger *slog.Logger
	// MaxRequestLog caps the requests Requests returns (the oldest are
	// dropped first); 0 means DefaultMaxRequestLog, negative keeps none.
	// CountRequests counts every request regardless of the cap.
	MaxRequestLog int
	// MessageOrderSeed, when not zero, shuffles the ids from 29 up and the
	// order of the handshake's message table (as builds of VPP differ), so
	// tests can prove a client hard-codes no id. 0 keeps the stable order.
	MessageOrderSeed int64
	// InterfaceDelay, when not zero, makes the configured interfaces appear
	// only this long after the simulator starts and after every Restart
	// (local0 is there at once), as interfaces created by VPP's
	// startup-config appear 2 s after its API answers.
	InterfaceDelay time.Duration
	// InterfacesOnDemand makes the configured interfaces appear only when
	// CreateInterfaces is called, after the start and after every Restart
	// (local0 is there at once): a test that must see a client wait for
	// its interface decides when the wait ends. It overrides InterfaceDelay.
	InterfacesOnDemand bool
	// NoVXLAN leaves the vxlan plugin's messages out of the message table, as in VPP's minimal build
	// (no plugins): a client that checks for them finds them missing.
	NoVXLAN bool
}

// Faults are switchable misbehaviours, applied from the next message on.
type Faults struct {
	// HangUpAfter > 0 closes each connection accepted from now on after it
	// received this many messages (handshake included); the last one is
	// processed and answered first.
	HangUpAfter int
	// NoReply applies requests but sends no reply; control_ping is still
	// answered (unless NoPingReply) and so is the sockclnt handshake.
	// Dumps send no details, only the closing control_ping_reply.
	NoReply bool
	// NoPingReply stops answering control_ping (GoVPP's health check, and
	// the end of every dump, then time out).
	NoPingReply bool
	// ReplyDelay delays the processing of every request that has a handler,
	// as a busy VPP main thread would.
	ReplyDelay time.Duration
	// Frozen stops reading every connection, new ones included (their
	// handshake too), with the sockets open: a SIGSTOPped VPP. What was sent
	// meanwhile is processed once it is off.
	Frozen bool
	// HangUpOn names a request (e.g. "ipip_add_tunnel"): the next one received is applied, not answered,
	// and its connection closed, as when VPP's reply is lost with the connection; then the fault clears.
	HangUpOn string
	// DropBFDEvents sends no bfd_udp_session_event: the client never hears of its sessions' state changes,
	// as when GoVPP drops notifications its full buffer cannot take (it only logs them); a dump still tells.
	DropBFDEvents bool
}

// Sim is one simulated VPP. Its methods are safe for concurrent use.
type Sim struct {
	log    *slog.Logger
	cfg    Config
	table  *msgTable
	maxLog int
	faults atomic.Pointer[Faults]

	// opMu serialises Listen, Close and Restart.
	opMu sync.Mutex

	lmu    sync.Mutex // guards the listener fields below
	ln     *net.UnixListener
	path   string
	conns  map[*conn]struct{}
	closed bool
	wg     sync.WaitGroup // accept loop and connection goroutines

	mu            sync.Mutex // guards the VPP state below
	pid           uint32
	nextClient    uint32
	clients       map[uint32]*conn        // registered client index -> connection
	eventRegs     map[uint32]uint32       // want_interface_events: client index -> pid
	bfdEventRegs  map[uint32]struct{}     // want_bfd_events: client indexes (bfd.go)
	bfdSessions   map[bfdKey]*bfdSession  // BFD sessions (bfd.go)
	bfdOrder      []bfdKey                // BFD session keys in creation order
	bfdPeers      map[netip.Addr]struct{} // peers that answer BFD (SetBFDPeerAnswering); kept across restarts
	tables        map[tableKey]*fibTable
	ifaces        []*iface // indexed by sw_if_index
	ifacePrefixes map[netip.Prefix]struct{}
	statsIndex    uint32
	lateIfaces    *time.Timer         // creates the interfaces after InterfaceDelay; nil when none is due
	teib          []teibEntry         // TEIB entries, in the order added (tunnel.go)
	neighbors     []neighbor          // IP neighbours added over the API, in the order added (vxlan.go)
	nexts         map[string][]string // graph nodes' nexts changed by add_node_next (vxlan.go)

	rmu    sync.Mutex // guards the request log below
	reqs   []Request
	counts map[string]int
}

// New validates cfg and returns a Sim in its initial state, not listening.
func New(cfg Config) (*Sim, error) {
	if cfg.Interfaces == nil {
		cfg.Interfaces = []string{DefaultInterface}
	}
	seen := map[string]bool{"local0": true}
	for _, n := range cfg.Interfaces {
		if n == "" || len(n) >= 64 {
			return nil, fmt.Errorf("interface name %q: must be 1-63 bytes", n)
		}
		if seen[n] {
			return nil, fmt.Errorf("interface name %q: duplicate", n)
		}
		seen[n] = true
	}
	if cfg.Version == "" {
		cfg.Version = DefaultVersion
	}
	if len(cfg.Version) >= 32 {
		return nil, fmt.Errorf("version %q: must be shorter than 32 bytes", cfg.Version)
	}
	table, err := buildMsgTable(cfg.CRCOverrides, cfg.MessageOrderSeed, !cfg.NoVXLAN)
	if err != nil {
		return nil, err
	}
	s := &Sim{
		log:    cfg.Logger,
		cfg:    cfg,
		table:  table,
		maxLog: cfg.MaxRequestLog,
		conns:  make(map[*conn]struct{}),
		counts: make(map[string]int),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.maxLog == 0 {
		s.maxLog = DefaultMaxRequestLog
	}
	s.faults.Store(&Faults{})
	s.mu.Lock()
	s.reset()
	s.mu.Unlock()
	return s, nil
}

// reset puts the VPP state in its boot state with a new pid. Call with s.mu held.
func (s *Sim) reset() {
	old := s.pid
	for s.pid == old {
		s.pid = 1000 + rand.Uint32N(4_000_000)
	}
	s.clients = make(map[uint32]*conn)
	s.eventRegs = make(map[uint32]uint32)
	s.bfdStopTimers()
	s.bfdEventRegs = make(map[uint32]struct{})
	s.bfdSessions = make(map[bfdKey]*bfdSession)
	s.bfdOrder = nil
	if s.bfdPeers == nil {
		s.bfdPeers = make(map[netip.Addr]struct{})
	}
	s.tables = make(map[tableKey]*fibTable)
	s.ifacePrefixes = make(map[netip.Prefix]struct{})
	for _, ip6 := range []bool{false, true} {
		k := tableKey{0, ip6}
		s.tables[k] = s.newTable(k, defaultTableName(k))
	}
	if s.lateIfaces != nil {
		s.lateIfaces.Stop()
		s.lateIfaces = nil
	}
	if s.ifaces == nil || s.cfg.InterfaceDelay > 0 || s.cfg.InterfacesOnDemand {
		s.ifaces = []*iface{{index: 0, name: "local0"}}
		if s.cfg.InterfacesOnDemand {
			// CreateInterfaces adds them.
		} else if s.cfg.InterfaceDelay > 0 {
			var t *time.Timer
			t = time.AfterFunc(s.cfg.InterfaceDelay, func() {
				s.mu.Lock()
				defer s.mu.Unlock()
				if s.lateIfaces == t {
					s.lateIfaces = nil
					s.createInterfaces()
					s.log.Info("vppsim: interfaces created", "interfaces", s.cfg.Interfaces)
				}
			})
			s.lateIfaces = t
		} else {
			s.createInterfaces()
		}
	}
	for _, ifc := range s.ifaces {
		ifc.adminUp = false
		ifc.carrier = ifc.index != 0
		ifc.addrs = nil
		ifc.deleted = false // the startup-config creates it again
	}
}

// CreateInterfaces adds the configured interfaces now, as VPP's startup-config
// does, when they do not exist yet (Config.InterfacesOnDemand, or before an
// InterfaceDelay has passed). It reports an error when they already exist.
func (s *Sim) CreateInterfaces() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ifaces) > 1 {
		return errors.New("vppsim: the interfaces exist already")
	}
	if s.lateIfaces != nil {
		s.lateIfaces.Stop()
		s.lateIfaces = nil
	}
	s.createInterfaces()
	s.log.Info("vppsim: interfaces created", "interfaces", s.cfg.Interfaces)
	return nil
}

// createInterfaces adds the configured interfaces, sw_if_index 1..N, admin
// down with carrier. Call with s.mu held.
func (s *Sim) createInterfaces() {
	for i, n := range s.cfg.Interfaces {
		idx := uint32(i + 1)
		s.ifaces = append(s.ifaces, &iface{
			index:   idx,
			name:    n,
			carrier: true,
			mac:     [6]byte{0x02, 0xfe, byte(idx >> 24), byte(idx >> 16), byte(idx >> 8), byte(idx)},
		})
	}
}

func defaultTableName(k tableKey) string {
	if k.ip6 {
		return fmt.Sprintf("ipv6-VRF:%d", k.id)
	}
	return fmt.Sprintf("ipv4-VRF:%d", k.id)
}

// Listen creates the unix socket at socketPath (removing a stale one, as VPP
// does) and accepts connections in background goroutines. It returns once
// the socket accepts.
func (s *Sim) Listen(socketPath string) error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.lmu.Lock()
	busy := s.ln != nil
	s.lmu.Unlock()
	if busy {
		return errors.New("vppsim: already listening")
	}
	return s.listen(socketPath)
}

func (s *Sim) listen(socketPath string) error {
	if err := os.Remove(socketPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale socket %s: %w", socketPath, err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socketPath, Net: "unix"})
	if err != nil {
		return fmt.Errorf("listen on %s: %w", socketPath, err)
	}
	ln.SetUnlinkOnClose(false)
	s.lmu.Lock()
	s.ln, s.path, s.closed = ln, socketPath, false
	s.lmu.Unlock()
	s.wg.Add(1)
	go s.acceptLoop(ln)
	s.log.Info("vppsim listening", "socket", socketPath, "pid", s.PID())
	return nil
}

func (s *Sim) acceptLoop(ln *net.UnixListener) {
	defer s.wg.Done()
	for {
		nc, err := ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Warn("vppsim accept failed", "err", err)
			}
			return
		}
		c := s.newConn(nc)
		s.lmu.Lock()
		if s.ln != ln {
			s.lmu.Unlock()
			_ = nc.Close()
			continue
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.lmu.Unlock()
		go func() {
			defer s.wg.Done()
			c.serve()
			s.lmu.Lock()
			delete(s.conns, c)
			s.lmu.Unlock()
		}()
	}
}

// stop closes the listener and every connection, and waits for their
// goroutines. Like VPP, it leaves the socket file behind: connecting to it
// fails with ECONNREFUSED until the next Listen replaces it.
func (s *Sim) stop() {
	s.lmu.Lock()
	ln := s.ln
	s.ln = nil
	if ln != nil {
		_ = ln.Close()
	}
	for c := range s.conns {
		c.kill()
	}
	s.lmu.Unlock()
	s.wg.Wait()
}

// Close stops accepting and closes all connections, leaving the socket file
// behind as VPP does. It is idempotent.
func (s *Sim) Close() error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.lmu.Lock()
	done := s.closed
	s.closed = true
	s.lmu.Unlock()
	if done {
		return nil
	}
	s.stop()
	s.mu.Lock()
	s.bfdStopTimers()
	if s.lateIfaces != nil {
		s.lateIfaces.Stop()
		s.lateIfaces = nil
	}
	s.mu.Unlock()
	return nil
}

// Restart simulates a VPP restart: every client is dropped, the socket is
// removed and recreated, the pid changes and the FIB is back to its boot
// state (interfaces keep existing, admin-down, without addresses; no API
// routes; only table 0). Faults and the request log are kept.
func (s *Sim) Restart() error {
	s.opMu.Lock()
	defer s.opMu.Unlock()
	s.lmu.Lock()
	path, closed := s.path, s.closed
	s.lmu.Unlock()
	if path == "" || closed {
		return errors.New("vppsim: restart needs a listening simulator")
	}
	s.stop()
	s.mu.Lock()
	s.reset()
	s.dropVXLAN()
	s.dropTunnels()
	s.mu.Unlock()
	return s.listen(path)
}

// PID returns the simulated VPP's pid, as control_ping_reply carries it.
func (s *Sim) PID() uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

// SocketPath returns the path given to Listen ("" before).
func (s *Sim) SocketPath() string {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	return s.path
}

// SetFaults replaces the active faults.
func (s *Sim) SetFaults(f Faults) {
	s.faults.Store(&f)
}

// Routes returns a deep copy of the FIB of one table (IPv4 or IPv6), sorted
// by prefix (address, then length), each entry with the paths of its best
// source. It returns nil for an unknown table.
func (s *Sim) Routes(tableID uint32, ip6 bool) []Route {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tables[tableKey{tableID, ip6}]
	if t == nil {
		return nil
	}
	out := make([]Route, 0, len(t.entries))
	for _, e := range t.entries {
		src, paths := e.best()
		out = append(out, t.export(e, src, paths))
	}
	slices.SortFunc(out, func(a, b Route) int { return a.Prefix.Compare(b.Prefix) })
	return out
}

// APIRoutes returns the API-sourced routes of one table, IPv4 then IPv6,
// each sorted by prefix, with their API paths (even where an interface or
// special source currently wins).
func (s *Sim) APIRoutes(tableID uint32) []Route {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Route
	for _, ip6 := range []bool{false, true} {
		t := s.tables[tableKey{tableID, ip6}]
		if t == nil {
			continue
		}
		start := len(out)
		for _, e := range t.entries {
			if e.api != nil {
				out = append(out, t.export(e, SourceAPI, e.api))
			}
		}
		slices.SortFunc(out[start:], func(a, b Route) int { return a.Prefix.Compare(b.Prefix) })
	}
	return out
}

// APIRoute returns the API-sourced route of prefix p in one table, with its API paths, and whether
// there is one: one entry, for callers that would otherwise copy a large table to check one route.
func (s *Sim) APIRoute(tableID uint32, p netip.Prefix) (Route, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tables[tableKey{tableID, p.Addr().Is6()}]
	if t == nil {
		return Route{}, false
	}
	e := t.entries[p]
	if e == nil || e.api == nil {
		return Route{}, false
	}
	return t.export(e, SourceAPI, e.api), true
}

// AllRoutes returns every table's routes: tables ordered by (IPv6, id),
// routes as Routes orders them.
func (s *Sim) AllRoutes() []Route {
	s.mu.Lock()
	keys := make([]tableKey, 0, len(s.tables))
	for k := range s.tables {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	slices.SortFunc(keys, compareTableKeys)
	var out []Route
	for _, k := range keys {
		out = append(out, s.Routes(k.id, k.ip6)...)
	}
	return out
}

func compareTableKeys(a, b tableKey) int {
	if a.ip6 != b.ip6 {
		if a.ip6 {
			return 1
		}
		return -1
	}
	return cmp.Compare(a.id, b.id)
}

// AddRoute injects a pre-existing route as another API client would have
// added it (SourceAPI, replacing that prefix's API paths; r.Source is
// ignored). The table must exist, the prefix is masked, every path needs a
// known Type and an existing interface (or ^uint32(0)).
func (s *Sim) AddRoute(r Route) error {
	if !r.Prefix.IsValid() {
		return fmt.Errorf("add route: invalid prefix %v", r.Prefix)
	}
	pfx := netaddr.Canonical(r.Prefix)
	if len(r.Paths) == 0 {
		return fmt.Errorf("add route %v: no paths", pfx)
	}
	ip6 := pfx.Addr().Is6()
	s.mu.Lock()
	defer s.mu.Unlock()
	t := s.tables[tableKey{r.TableID, ip6}]
	if t == nil {
		return fmt.Errorf("add route %v: no table %d", pfx, r.TableID)
	}
	paths := make([]fibPath, 0, len(r.Paths))
	for _, p := range r.Paths {
		fp, ok := s.pathFromExported(p, ip6)
		if !ok {
			return fmt.Errorf("add route %v: invalid path %+v", pfx, p)
		}
		paths = append(paths, fp)
	}
	s.apiReplace(t, pfx, paths)
	return nil
}

// ResolveNeighbor plays a resolved ARP/ND entry of addr on interface
// swIfIndex: VPP then has an adjacency /32 (/128) "addr via addr" on that
// interface in table 0, which ip_route_dump returns like any route and an
// API delete does not remove (measured).
func (s *Sim) ResolveNeighbor(swIfIndex uint32, addr netip.Addr) error {
	addr = addr.Unmap()
	if !addr.IsValid() {
		return errors.New("resolve neighbor: invalid address")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ifaceAt(swIfIndex) == nil || swIfIndex == 0 {
		return fmt.Errorf("resolve neighbor %v: no interface with sw_if_index %d", addr, swIfIndex)
	}
	t := s.tables[tableKey{0, addr.Is6()}]
	e := s.getEntry(t, netip.PrefixFrom(addr, addr.BitLen()))
	e.adj = []fibPath{{typ: fib_types.FIB_API_PATH_TYPE_NORMAL, proto: protoOf(addr.Is6()), swIfIndex: swIfIndex, nh: addr, weight: 1}}
	return nil
}

// Interfaces returns a snapshot of all interfaces, local0 first.
func (s *Sim) Interfaces() []Interface {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Interface, 0, len(s.ifaces))
	for _, ifc := range s.ifaces {
		if !ifc.deleted {
			out = append(out, ifc.export())
		}
	}
	return out
}

// SetLinkState sets the carrier of an interface (the link VPP reports is up
// only while the interface is also admin up) and sends sw_interface_event to
// every registered client, even when the state did not change (as a
// flapping link would).
func (s *Sim) SetLinkState(swIfIndex uint32, up bool) error {
	s.mu.Lock()
	ifc := s.ifaceAt(swIfIndex)
	if ifc == nil {
		s.mu.Unlock()
		return fmt.Errorf("set link state: no interface with sw_if_index %d", swIfIndex)
	}
	wasUp := ifc.linkUp()
	ifc.carrier = up
	targets := s.eventTargets()
	ev := ifaceEvent(ifc)
	bfdEvs := s.bfdLinkChanged(swIfIndex, wasUp)
	s.mu.Unlock()
	s.sendEvents(targets, ev)
	s.sendBFDEvents(bfdEvs)
	return nil
}

// SetAddress adds (or with add false removes) address p, host bits and prefix length as an operator
// gives them ("set interface ip address [del]"), on interface swIfIndex, with
// sw_interface_add_del_address's checks; a non-zero retval is an error.
func (s *Sim) SetAddress(swIfIndex uint32, p netip.Prefix, add bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := &interfaces.SwInterfaceAddDelAddress{SwIfIndex: interface_types.InterfaceIndex(swIfIndex), IsAdd: add,
		Prefix: ip_types.AddressWithPrefix(prefixToAPI(p))}
	if rv := s.addDelAddress(m); rv != rvOK {
		return fmt.Errorf("vppsim: set address %v on sw_if_index %d (add %v): retval %d", p, swIfIndex, add, rv)
	}
	return nil
}

// ifaceAt returns the interface of index idx, nil when there is none (or it was deleted). Call with
// s.mu held.
func (s *Sim) ifaceAt(idx uint32) *iface {
	if int64(idx) >= int64(len(s.ifaces)) || s.ifaces[idx].deleted {
		return nil
	}
	return s.ifaces[idx]
}

// DeleteInterface deletes the interface named name, as "delete loopback interface intfc <name>" does
// on VPP 26.06 (measured): it leaves the dumps, its addresses and their interface routes go, a
// neighbour adjacency on it goes, and every API route through it stays in the FIB, dumped as before
// with the deleted sw_if_index in its paths, but drops its traffic (Route.Unresolved) for good: an
// interface created later with that name and index does not revive it, only a changed path set or a
// delete and add does, once no dead route with the same paths is left (they share a path list). Adding a route through the deleted index fails with -54. Every client
// registered for interface events gets sw_interface_event with deleted set, flags 0.
func (s *Sim) DeleteInterface(name string) error {
	s.mu.Lock()
	var ifc *iface
	for _, i := range s.ifaces {
		if i.name == name && !i.deleted && i.index != 0 {
			ifc = i
		}
	}
	if ifc == nil {
		s.mu.Unlock()
		return fmt.Errorf("vppsim: delete interface %s: no such interface", name)
	}
	ifc.deleted, ifc.adminUp, ifc.addrs = true, false, nil
	s.syncInterfaceRoutes()
	for _, t := range s.tables {
		for _, e := range t.entries {
			for _, p := range e.api {
				if p.swIfIndex == ifc.index {
					e.apiDead = true
					t.dead[e] = struct{}{}
				}
			}
			if len(e.adj) > 0 && e.adj[0].swIfIndex == ifc.index {
				e.adj = nil
				t.gc(e)
			}
		}
		s.syncRR(t)
	}
	targets := s.eventTargets()
	ev := interfaces.SwInterfaceEvent{SwIfIndex: interface_types.InterfaceIndex(ifc.index), Deleted: true}
	s.mu.Unlock()
	s.sendEvents(targets, ev)
	return nil
}

// CreateInterface creates an interface named name, as "create loopback interface" does: it takes the
// index of a deleted interface of that name (VPP reuses the freed loopback instance and sw_if_index,
// measured), else the lowest free one, else the next; it is admin down, without addresses, and every
// client registered for interface events gets sw_interface_event. It returns the sw_if_index.
func (s *Sim) CreateInterface(name string) (uint32, error) {
	if name == "" || len(name) >= 64 {
		return 0, fmt.Errorf("vppsim: interface name %q: must be 1-63 bytes", name)
	}
	s.mu.Lock()
	var ifc *iface
	for _, i := range s.ifaces {
		switch {
		case i.name == name && !i.deleted:
			s.mu.Unlock()
			return 0, fmt.Errorf("vppsim: interface %s exists already", name)
		case i.deleted && (ifc == nil || i.name == name && ifc.name != name):
			ifc = i
		}
	}
	if ifc == nil {
		idx := uint32(len(s.ifaces))
		ifc = &iface{index: idx, mac: [6]byte{0x02, 0xfe, byte(idx >> 24), byte(idx >> 16), byte(idx >> 8), byte(idx)}}
		s.ifaces = append(s.ifaces, ifc)
	}
	ifc.name, ifc.deleted, ifc.adminUp, ifc.carrier, ifc.addrs = name, false, false, true, nil
	targets := s.eventTargets()
	ev := ifaceEvent(ifc)
	s.mu.Unlock()
	s.sendEvents(targets, ev)
	return ifc.index, nil
}

type eventTarget struct {
	c           *conn
	clientIndex uint32
	pid         uint32
}

// eventTargets lists the registered event receivers. Call with s.mu held.
func (s *Sim) eventTargets() []eventTarget {
	if len(s.eventRegs) == 0 {
		return nil
	}
	out := make([]eventTarget, 0, len(s.eventRegs))
	for idx, pid := range s.eventRegs {
		if c := s.clients[idx]; c != nil {
			out = append(out, eventTarget{c: c, clientIndex: idx, pid: pid})
		}
	}
	return out
}

func ifaceEvent(ifc *iface) interfaces.SwInterfaceEvent {
	return interfaces.SwInterfaceEvent{
		SwIfIndex: interface_types.InterfaceIndex(ifc.index),
		Flags:     ifaceFlags(ifc),
	}
}

func ifaceFlags(ifc *iface) interface_types.IfStatusFlags {
	var f interface_types.IfStatusFlags
	if ifc.adminUp {
		f |= interface_types.IF_STATUS_API_FLAG_ADMIN_UP
	}
	if ifc.linkUp() {
		f |= interface_types.IF_STATUS_API_FLAG_LINK_UP
	}
	return f
}

// sendEvents writes an interface event to each target, outside s.mu.
func (s *Sim) sendEvents(targets []eventTarget, ev interfaces.SwInterfaceEvent) {
	for _, t := range targets {
		e := ev
		e.PID = t.pid
		t.c.sendEvent(&e, t.clientIndex)
	}
}

// Request is one message a client sent whose id is in the message table,
// logged in arrival order, including the handshake and messages dropped for
// an unknown client_index.
type Request struct {
	Time   time.Time
	Client uint32 // client_index from the header (0 when the shape has none)
	Name   string // message name, e.g. "ip_route_add_del"
	// Msg is the decoded message; nil when it failed to decode or when its
	// type carries a 32-bit element count (never decoded, see msgtable.go).
	Msg api.Message
}

func (s *Sim) logRequest(client uint32, name string, msg api.Message) {
	now := time.Now()
	s.rmu.Lock()
	s.counts[name]++
	if s.maxLog > 0 {
		if len(s.reqs) >= s.maxLog {
			// Drop the oldest half at once: amortised O(1) per request.
			n := copy(s.reqs, s.reqs[len(s.reqs)-s.maxLog/2:])
			clear(s.reqs[n:])
			s.reqs = s.reqs[:n]
		}
		s.reqs = append(s.reqs, Request{Time: now, Client: client, Name: name, Msg: msg})
	}
	s.rmu.Unlock()
}

// Requests returns the logged requests, oldest first (at most MaxRequestLog).
func (s *Sim) Requests() []Request {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return slices.Clone(s.reqs)
}

// ResetRequests empties the request log and the counts.
func (s *Sim) ResetRequests() {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	s.reqs = nil
	clear(s.counts)
}

// CountRequests returns how many messages with this name were received since
// the last ResetRequests (not limited by MaxRequestLog).
func (s *Sim) CountRequests(name string) int {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	return s.counts[name]
}

// RequestCounts returns the number of received messages by name since the
// last ResetRequests.
func (s *Sim) RequestCounts() map[string]int {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	out := make(map[string]int, len(s.counts))
	for k, v := range s.counts {
		out[k] = v
	}
	return out
}
