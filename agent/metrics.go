package agent

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/internal/buildinfo"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// Metrics are the reconciler's and the registrar's Prometheus metrics.
type Metrics struct {
	desired, programmed, unresolved, peers prometheus.Gauge
	ops                                    *prometheus.CounterVec
	syncs                                  *prometheus.CounterVec
	syncDuration                           *prometheus.HistogramVec
	lastSync                               prometheus.Gauge
	drift                                  prometheus.Counter
	registrationUp                         prometheus.Gauge
	registrationConflict                   prometheus.Gauge
	held, invalidPeers                     prometheus.Gauge
	blocks                                 *prometheus.GaugeVec
	uplinkWaiting                          prometheus.Gauge
	undeletable                            prometheus.Counter
	defaultBlocks                          prometheus.Counter
	conflicts                              prometheus.Counter
	conflicting                            prometheus.Gauge
	eventToFIB                             prometheus.Histogram
	snapshots                              prometheus.Counter
	tunnels                                *prometheus.GaugeVec
	tunnelOps                              *prometheus.CounterVec
	routesByEncap                          *prometheus.GaugeVec
	podMTU                                 prometheus.Gauge
	mtuTooLarge                            prometheus.Gauge
	noVXLAN                                prometheus.Gauge
	offUplink, peerGaps                    prometheus.Counter
	ecmpRoutes                             prometheus.Gauge
	bfdSessions                            *prometheus.GaugeVec
	bfdTransitions, bfdOps                 *prometheus.CounterVec
	bfdPeersDown, bfdUnsupported           prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg (nil: unregistered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		desired: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_routes_desired",
			Help: "Routes this node must have in the FIB (resolved)."}),
		programmed: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_routes_programmed",
			Help: "Routes owned by the agent in the FIB, as of its last dump and writes."}),
		unresolved: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_routes_unresolved",
			Help: "Routes the agent cannot program (owner without peer IP, block outside the managed pools)."}),
		peers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_peers",
			Help: "Nodes with a registered peer IP."}),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vpp_route_agent_route_operations_total",
			Help: "FIB route operations by op (add, delete) and result (ok, error, dry_run)."}, []string{"op", "result"}),
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vpp_route_agent_syncs_total",
			Help: "Full resyncs by kind (what triggered them) and result."}, []string{"kind", "result"}),
		syncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vpp_route_agent_sync_duration_seconds",
			Help: "Duration of full resyncs (dump, diff, apply).", Buckets: prometheus.ExponentialBuckets(0.001, 4, 10)}, []string{"kind"}),
		lastSync: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_last_sync_timestamp_seconds",
			Help: "Unix time of the last successful full resync."}),
		drift: prometheus.NewCounter(prometheus.CounterOpts{Name: "vpp_route_agent_drift_corrections_total",
			Help: "Owned routes found different from what the agent had programmed, and repaired."}),
		registrationUp: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_registration_up",
			Help: "1 when this node's peer IP registration is present in etcd."}),
		registrationConflict: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_registration_conflict",
			Help: "1 while another agent holds this node's name in etcd (this agent does not register; see /readyz)."}),
		held: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_blocks_held",
			Help: "Blocks whose etcd value cannot be read: the routes inside them are kept as they are (see /debug/routes)."}),
		invalidPeers: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_peers_invalid",
			Help: "Registered peer IPs refused as next hops (loopback, link-local, this node's own, another node's, ...; see /debug/routes)."}),
		blocks: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vpp_route_agent_blocks",
			Help: "Blocks in the etcd view by kind: local (this node's), remote (another node's), unowned."}, []string{"kind"}),
		uplinkWaiting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_uplink_waiting",
			Help: "1 while VPP is connected but has no uplink interface of the configured name or index yet."}),
		undeletable: prometheus.NewCounter(prometheus.CounterOpts{Name: "vpp_route_agent_routes_undeletable_total",
			Help: "Routes VPP kept after the agent deleted them (its own entries, seen only without ip_route_v2_dump); treated as foreign from then on."}),
		defaultBlocks: prometheus.NewCounter(prometheus.CounterOpts{Name: "vpp_route_agent_default_route_blocks_total",
			Help: "Blocks of prefix length 0 seen (each once): they would be default routes and are never programmed."}),
		conflicts: prometheus.NewCounter(prometheus.CounterOpts{Name: "vpp_route_agent_route_conflicts_total",
			Help: "Times a route prefix the agent must program was found held by a route that is not its own (another client's, an interface address's, VPP's own); each is logged naming the prefix."}),
		conflicting: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_routes_conflicting",
			Help: "Route prefixes the agent must program that a route not its own holds now (see /debug/routes foreign_in_pools)."}),
		eventToFIB: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "vpp_route_agent_event_to_fib_seconds",
			Help:    "Time from receiving an etcd event to VPP acknowledging the FIB write.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2.5, 14)}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{Name: "vpp_route_agent_snapshots_total",
			Help: "etcd snapshots applied by the reconciler."}),
		tunnels: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vpp_route_agent_tunnels",
			Help: "Tunnels of the agent in VPP (tagged vpp-route-agent), by encapsulation."}, []string{"encap"}),
		tunnelOps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vpp_route_agent_tunnel_operations_total",
			Help: "Tunnel creations and deletions by op (create, delete) and result (ok, error)."}, []string{"op", "result"}),
		routesByEncap: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vpp_route_agent_routes_programmed_by_encap",
			Help: "Routes owned by the agent in the FIB by encapsulation: none (via the next hop on the uplink), ipip or vxlan (through a tunnel)."}, []string{"encap"}),
		mtuTooLarge: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_encap_mtu_too_large",
			Help: "Managed encapsulated pools whose tunnel MTU from FelixConfiguration (ipipMTU, vxlanMTU, vxlanMTUV6) plus the encapsulation's overhead (IPIP 20, VXLAN 50 or 70) exceeds the uplink's MTU: their full-size packets are fragmented or dropped (each logged once as a warning)."}),
		noVXLAN: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_routes_without_vxlan_plugin",
			Help: "Routes of VXLAN pools the agent cannot program because VPP has no vxlan plugin (also in /readyz); 0 when it has."}),
		podMTU: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_pod_mtu_bytes",
			Help: "The largest pod MTU the routes this node programs carry: the uplink's MTU, less 20 while a managed IPv4 pool uses IPIP, 50 (IPv4) or 70 (IPv6) while one uses VXLAN (or FelixConfiguration ipipMTU, vxlanMTU, vxlanMTUV6); 0 until the uplink's MTU is read."}),
		offUplink: prometheus.NewCounter(prometheus.CounterOpts{Name: "vpp_route_agent_peer_ips_off_uplinks_total",
			Help: "Peer IPs of other nodes found on no uplink's subnet (each logged once): no path goes to them; a route with no other path goes via the first peer IP on the first uplink, as with one uplink."}),
		peerGaps: prometheus.NewCounter(prometheus.CounterOpts{Name: "vpp_route_agent_peer_registration_gaps_total",
			Help: "Times a node's registration was found with a gap in its peer IP indexes (/1 and /3 without /2; each logged once): the addresses there are used."}),
		ecmpRoutes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_routes_programmed_ecmp",
			Help: "Routes owned by the agent in the FIB with more than one path (several uplinks or peer IPs)."}),
		bfdSessions: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vpp_route_agent_bfd_sessions",
			Help: "The agent's BFD sessions in VPP by state (admin-down, down, init, up), as last read or reported."}, []string{"state"}),
		bfdTransitions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vpp_route_agent_bfd_transitions_total",
			Help: "State changes of the agent's BFD sessions, by new state (from VPP's events, or found by a read of the sessions)."}, []string{"state"}),
		bfdOps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vpp_route_agent_bfd_session_operations_total",
			Help: "BFD session writes by op (add, modify, delete, reassert: delete and add after an uplink came up) and result (ok, error)."}, []string{"op", "result"}),
		bfdPeersDown: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_bfd_peers_down",
			Help: "Nodes with BFD sessions none of which is up: every path to them is out of forwarding (their routes drop)."}),
		bfdUnsupported: prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_bfd_unsupported",
			Help: "1 while --bfd is on and the connected VPP has no (compatible) BFD API: no sessions, routing goes on."}),
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vpp_route_agent_build_info",
		Help:        "Build information; always 1.",
		ConstLabels: prometheus.Labels{"version": buildinfo.Version, "revision": buildinfo.Revision(), "goversion": buildinfo.GoVersion()}})
	build.Set(1)
	if reg != nil {
		reg.MustRegister(m.offUplink, m.peerGaps, m.ecmpRoutes)
		reg.MustRegister(m.bfdSessions, m.bfdTransitions, m.bfdOps, m.bfdPeersDown, m.bfdUnsupported)
		reg.MustRegister(m.desired, m.programmed, m.unresolved, m.peers, m.ops, m.syncs, m.syncDuration, m.lastSync,
			m.drift, m.registrationUp, m.registrationConflict, m.held, m.invalidPeers, m.blocks, m.uplinkWaiting, m.undeletable, m.defaultBlocks, m.conflicts, m.conflicting, m.eventToFIB, m.snapshots,
			m.tunnels, m.tunnelOps, m.routesByEncap, m.podMTU, m.mtuTooLarge, m.noVXLAN, build)
	}
	// Export the series of every operation and resync kind from the start, at zero, so that rates and
	// the sync duration exist before the first resync (which waits for VPP and etcd).
	for _, op := range []string{"add", "delete"} {
		for _, result := range []string{"ok", "error", "dry_run"} {
			m.ops.WithLabelValues(op, result)
		}
	}
	for _, op := range []string{"create", "delete"} {
		for _, result := range []string{"ok", "error"} {
			m.tunnelOps.WithLabelValues(op, result)
		}
	}
	for st := vppapi.BFDAdminDown; st <= vppapi.BFDUp; st++ {
		m.bfdSessions.WithLabelValues(st.String())
		m.bfdTransitions.WithLabelValues(st.String())
	}
	for _, op := range []string{"add", "modify", "delete", "reassert"} {
		m.bfdOps.WithLabelValues(op, "ok")
		m.bfdOps.WithLabelValues(op, "error")
	}
	m.tunnels.WithLabelValues("ipip")
	m.routesByEncap.WithLabelValues("none")
	m.routesByEncap.WithLabelValues("ipip")
	for _, k := range blockKindNames {
		m.blocks.WithLabelValues(k)
	}
	for _, kind := range syncKinds() {
		m.syncs.WithLabelValues(kind, "ok")
		m.syncs.WithLabelValues(kind, "error")
		m.syncDuration.WithLabelValues(kind)
	}
	return m
}

// syncKinds are the kind label values of the resync metrics: what triggered a full resync.
func syncKinds() []string {
	kinds := []string{"periodic", "retry", "vpp-connect", "vpp-restart", "uplink-lost", "relist-pools", "tunnel-config"}
	for _, r := range blockwatch.RelistReasons() {
		kinds = append(kinds, "relist-"+r)
	}
	return kinds
}

func (m *Metrics) orNop() *Metrics {
	if m == nil {
		return NewMetrics(nil)
	}
	return m
}

func (m *Metrics) syncDone(kind string, start time.Time, err error) {
	result := "ok"
	if err != nil {
		result = "error"
	} else {
		m.lastSync.Set(float64(time.Now().UnixNano()) / 1e9)
	}
	m.syncs.WithLabelValues(kind, result).Inc()
	m.syncDuration.WithLabelValues(kind).Observe(time.Since(start).Seconds())
}

func (m *Metrics) countOps(adds, dels int, failed []vppapi.RouteError) {
	fa, fd := 0, 0
	for _, f := range failed {
		if f.Op == vppapi.OpAdd {
			fa++
		} else {
			fd++
		}
	}
	m.ops.WithLabelValues("add", "ok").Add(float64(adds - fa))
	m.ops.WithLabelValues("add", "error").Add(float64(fa))
	m.ops.WithLabelValues("delete", "ok").Add(float64(dels - fd))
	m.ops.WithLabelValues("delete", "error").Add(float64(fd))
}

// setBlocks sets the block gauge by kind.
func (m *Metrics) setBlocks(counts [numBlockKinds]int) {
	for k, n := range counts {
		m.blocks.WithLabelValues(blockKindNames[k]).Set(float64(n))
	}
}
