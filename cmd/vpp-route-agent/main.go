// Command vpp-route-agent keeps the VPP FIB of this node equal to the routes to the Calico IPAM blocks
// of the other nodes. See docs/agent.md for the flags, metrics and operations.
package main

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
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/internal/buildinfo"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdconfig"
	"github.com/vpp-route-agent/vpp-route-agent/internal/flagenv"
	"github.com/vpp-route-agent/vpp-route-agent/internal/httpserve"
	"github.com/vpp-route-agent/vpp-route-agent/internal/logging"
	"github.com/vpp-route-agent/vpp-route-agent/internal/sdnotify"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
	"golang.org/x/sync/errgroup"
)

// defaultMetricsAddress is loopback: the server is opened to the network only when told.
const defaultMetricsAddress = "127.0.0.1:9482"

// shutdownLimit bounds how long a stop may take after SIGTERM.
const shutdownLimit = 5 * time.Second

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.LookupEnv)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, pflag.ErrHelp):
	case isUsage(err):
		fmt.Fprintln(os.Stderr, "vpp-route-agent:", err)
		os.Exit(2)
	case errors.Is(err, errDisagrees):
		fmt.Fprintln(os.Stderr, "vpp-route-agent:", err)
		os.Exit(3)
	default:
		fmt.Fprintln(os.Stderr, "vpp-route-agent:", err)
		os.Exit(1)
	}
}

// run dispatches to the daemon or a subcommand.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) (string, bool)) error {
	if len(args) > 0 && args[0] == "routes" {
		return routesCmd(ctx, args[1:], stdout, stderr, getenv)
	}
	if len(args) > 0 && args[0] == "explain" {
		return explainCmd(ctx, args[1:], stdout, stderr, getenv)
	}
	if len(args) > 0 && args[0] == "probe" {
		return probeCmd(ctx, args[1:], stdout, stderr, getenv)
	}
	cfg, err := parseDaemonFlags(args, stdout, stderr, getenv)
	if err != nil || cfg == nil {
		return err
	}
	return daemon(ctx, cfg)
}

// defaultGCPercent is the agent's Go GC target unless GOGC says otherwise: its heap is almost all
// long-lived routing state (listed once, then changed a block at a time), so the runtime's 100 would
// double its memory for little CPU saved. 40 is also Felix's default (goGCThreshold).
const defaultGCPercent = 40

// startupGCPercent is the Go GC target until the first full resync is done, unless --go-gc-percent
// is higher: the first list builds the whole view from an empty heap, with about twice its size in
// garbage (the etcd responses), which the steady target would collect a dozen times over, each
// collection taking CPU from the list, etcd and VPP. The garbage is handed back after that resync.
// At 100,000 blocks: 12% less CPU for the cold start, and a peak RSS 30-40 MB higher
// (BenchmarkColdStart100k, BenchmarkMemory100k).
const startupGCPercent = 100

// daemonConfig is everything the daemon needs, validated.
type daemonConfig struct {
	etcd             etcdFlags
	node             string
	vppSocket        string
	vppTimeout       time.Duration
	uplink           vppapi.Uplink   // the first uplink
	moreUplinks      []vppapi.Uplink // the further uplinks, in --uplink-interface order
	peerIPs          []netip.Addr    // in uplink order: registered as peerip/<family>/1, /2, ...
	agent            agent.Config
	registrationTTL  time.Duration
	deregisterOnExit bool
	metricsAddress   string
	log              *slog.Logger
	// gcPercent is the Go GC target (debug.SetGCPercent); 0 leaves the runtime's (GOGC).
	gcPercent int
	// startupCPUProfile, when set, is a file the daemon writes a CPU profile of its cold start to:
	// from its start to its first full resync done (the benchmarks' VPP_ROUTE_AGENT_STARTUP_CPUPROFILE).
	startupCPUProfile string
}

// bfdPeerIPs are the peer IPs advertised as answering BFD: every uplink address, with --bfd.
func (cfg *daemonConfig) bfdPeerIPs() []netip.Addr {
	if !cfg.agent.BFD.Enabled {
		return nil
	}
	var out []netip.Addr
	for _, u := range append([]vppapi.Uplink{cfg.uplink}, cfg.moreUplinks...) {
		for _, p := range u.Addresses {
			out = append(out, p.Addr())
		}
	}
	return out
}

// parseDaemonFlags parses and validates every flag before anything connects. It returns nil, nil when
// it printed --help or --version.
func parseDaemonFlags(args []string, stdout, stderr io.Writer, getenv func(string) (string, bool)) (*daemonConfig, error) {
	fs := pflag.NewFlagSet("vpp-route-agent", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var ef etcdFlags
	ef.register(fs)
	var (
		vppSocket      = fs.String("vpp-api-socket", "/run/vpp/api.sock", "VPP binary API socket")
		vppTimeout     = fs.Duration("vpp-reply-timeout", 2*time.Second, "deadline of each VPP API request")
		uplinkNames    = fs.StringSlice("uplink-interface", nil, "VPP uplink interface name, e.g. GigabitEthernet0/8/0 (repeatable: one per uplink of a multi-homed node, routes go over all as ECMP)")
		uplinkIndex    = fs.Int64("uplink-sw-if-index", -1, "VPP uplink sw_if_index (instead of --uplink-interface)")
		uplinkAddrs    = fs.StringSlice("uplink-address", nil, "address to configure on the uplink, CIDR; also the registered peer IP. One uplink: repeatable, one per family. Several: one entry per uplink in --uplink-interface order, both families of one uplink joined by '+' (10.0.0.1/24+fd00::1/64)")
		peerIPs        = fs.StringSlice("peer-ip", nil, "peer IP to register without configuring it on the uplink; given like --uplink-address (one per family; per uplink with several, joined by '+')")
		tableID        = fs.Uint32("table-id", 0, "VPP FIB table the routes go into (both families)")
		regTTL         = fs.Duration("registration-ttl", 30*time.Second, "TTL of the etcd lease of this node's peer IP registration")
		grace          = fs.Duration("peer-loss-grace", agent.DefaultPeerLossGrace, "how long routes to a node whose registration vanished are kept")
		resync         = fs.Duration("resync-interval", agent.DefaultResyncInterval, "period of the full resync that repairs drift")
		metricsAddr    = fs.String("metrics-address", defaultMetricsAddress, "listen address of /metrics, /healthz, /readyz, /debug/routes; empty disables (loopback by default: /debug/routes lists every route and peer)")
		logLevel       = fs.String("log-level", "info", "debug, info, warn or error")
		logFormat      = fs.String("log-format", "text", "text or json")
		dryRun         = fs.Bool("dry-run", false, "compute and log the FIB changes, write nothing to VPP and register nothing")
		withdrawOnExit = fs.Bool("withdraw-on-exit", false, "remove every route the agent owns when it stops")
		deregister     = fs.Bool("deregister-on-exit", false, "revoke this node's registration when it stops (decommissioning)")
		version        = fs.Bool("version", false, "print the version and exit")
		bfdOn          = fs.Bool("bfd", false, "advertise BFD on this node's uplink addresses and open a VPP BFD session to every other node's peer IP that advertises it (VPP then takes a dead peer's paths out of forwarding within interval x multiplier); needs --uplink-address")
		bfdInterval    = fs.Duration("bfd-interval", agent.DefaultBFDInterval, "BFD desired min TX and required min RX of every session, 10ms-60s")
		bfdMultiplier  = fs.Uint("bfd-multiplier", agent.DefaultBFDMultiplier, "BFD detect multiplier, 2-255: a peer is down after this many intervals without a packet")
		gcPercent      = fs.Int("go-gc-percent", defaultGCPercent, "Go GC target: the heap grows this many percent over the live data before a collection (GOGC, which this flag overrides when given); lower trades CPU for memory")
	)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: vpp-route-agent [flags]\n       vpp-route-agent routes [flags]\n       vpp-route-agent explain [flags] ADDRESS|PREFIX\n       vpp-route-agent probe [flags] /healthz|/readyz\n\n"+
			"Keeps the VPP FIB equal to the routes to the Calico IPAM blocks of the other nodes.\n"+
			"Every flag falls back to the environment variable named after it.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	flagEnv.Annotate(fs)
	if err := fs.Parse(args); err != nil {
		return nil, usageError{err}
	}
	if *version {
		fmt.Fprintf(stdout, "vpp-route-agent %s (revision %s, %s)\n", buildinfo.Version, buildinfo.Revision(), buildinfo.GoVersion())
		return nil, nil
	}
	if err := flagEnv.Apply(fs, getenv); err != nil {
		return nil, usageError{err}
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))}
	}
	bad := func(err error) (*daemonConfig, error) { return nil, usageError{err} }
	if err := ef.validate(getenv); err != nil {
		return bad(err)
	}
	log, err := logging.New(*logLevel, *logFormat, os.Stderr)
	if err != nil {
		return bad(err)
	}
	node, err := flagenv.NodeName(ef.nodename, flagenv.NodenameFile)
	if err != nil {
		return bad(err)
	}
	cfg := &daemonConfig{etcd: ef, node: node, vppSocket: *vppSocket, vppTimeout: *vppTimeout,
		registrationTTL: *regTTL, deregisterOnExit: *deregister, metricsAddress: *metricsAddr, log: log}
	if *gcPercent < 1 {
		return bad(fmt.Errorf("--go-gc-percent %d must be at least 1", *gcPercent))
	}
	if _, fromEnv := getenv("GOGC"); fs.Changed("go-gc-percent") || !fromEnv {
		cfg.gcPercent = *gcPercent
	}
	cfg.startupCPUProfile, _ = getenv(startupCPUProfileEnv)
	if *vppSocket == "" {
		return bad(errors.New("--vpp-api-socket is empty"))
	}
	if *vppTimeout <= 0 {
		return bad(errors.New("--vpp-reply-timeout must be positive"))
	}
	uplinks, err := parseUplinks(*uplinkNames, *uplinkIndex, fs.Changed("uplink-sw-if-index"))
	if err != nil {
		return bad(err)
	}
	if len(*peerIPs) > 0 && len(*uplinkAddrs) > 0 {
		return bad(errors.New("--peer-ip and --uplink-address are exclusive: the uplink address is the peer IP"))
	}
	addrs, err := perUplink("--uplink-address", *uplinkAddrs, len(uplinks), netip.ParsePrefix, netip.Prefix.Addr)
	if err != nil {
		return bad(err)
	}
	peers, err := perUplink("--peer-ip", *peerIPs, len(uplinks), netip.ParseAddr, func(a netip.Addr) netip.Addr { return a })
	if err != nil {
		return bad(err)
	}
	for i := range uplinks {
		for _, p := range addrs[i] {
			uplinks[i].Addresses = append(uplinks[i].Addresses, p)
			cfg.peerIPs = append(cfg.peerIPs, p.Addr())
		}
		for _, a := range peers[i] {
			cfg.peerIPs = append(cfg.peerIPs, a.Unmap())
		}
	}
	cfg.uplink, cfg.moreUplinks = uplinks[0], uplinks[1:]
	if len(cfg.peerIPs) == 0 && !*dryRun {
		return bad(errors.New("--uplink-address or --peer-ip is required: the IP other nodes route this node's blocks to"))
	}
	if *regTTL < 5*time.Second || *regTTL > 10*time.Minute {
		return bad(fmt.Errorf("--registration-ttl: %s is outside 5s-10m", *regTTL))
	}
	if *grace < 0 {
		return bad(fmt.Errorf("--peer-loss-grace: %s is negative", *grace))
	}
	if *resync < time.Second {
		return bad(fmt.Errorf("--resync-interval: %s is below 1s", *resync))
	}
	if *metricsAddr != "" {
		if _, _, err := net.SplitHostPort(*metricsAddr); err != nil {
			return bad(fmt.Errorf("--metrics-address: %w", err))
		}
	}
	if *bfdMultiplier < agent.MinBFDMultiplier || *bfdMultiplier > 255 {
		return bad(fmt.Errorf("--bfd-multiplier %d: want %d to 255", *bfdMultiplier, agent.MinBFDMultiplier))
	}
	if *bfdOn && len(*uplinkAddrs) == 0 && !*dryRun {
		return bad(errors.New("--bfd needs --uplink-address: a BFD session's local address is the uplink's address on the peer's subnet"))
	}
	pools, _ := ef.pools()
	cfg.agent = agent.Config{NodeName: node, TableID: *tableID, Pools: pools, Uplink: cfg.uplink, MoreUplinks: cfg.moreUplinks, PeerIPs: cfg.peerIPs,
		ResyncInterval: *resync, PeerLossGrace: *grace, DryRun: *dryRun, WithdrawOnExit: *withdrawOnExit, Logger: log,
		BFD: agent.BFDConfig{Enabled: *bfdOn, Interval: *bfdInterval, Multiplier: uint8(*bfdMultiplier)}}
	if err := cfg.agent.Validate(); err != nil {
		return bad(err)
	}
	return cfg, nil
}

// daemon runs the agent until ctx is done, then stops within shutdownLimit.
func daemon(ctx context.Context, cfg *daemonConfig) error {
	log := cfg.log
	if cfg.gcPercent > 0 {
		debug.SetGCPercent(max(cfg.gcPercent, startupGCPercent))
	}
	stopProfile := func() {}
	if cfg.startupCPUProfile != "" {
		var err error
		if stopProfile, err = startCPUProfile(cfg.startupCPUProfile); err != nil {
			return err
		}
		defer stopProfile()
	}
	log.Info("starting vpp-route-agent", "version", buildinfo.Version, "node", cfg.node, "etcd", etcdconfig.Redacted(cfg.etcd.Endpoints),
		"etcd_user", cfg.etcd.Username, "vpp_socket", cfg.vppSocket, "table", cfg.agent.TableID, "dry_run", cfg.agent.DryRun)
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cli, err := cfg.etcd.Connect(ctx, log)
	if err != nil {
		return err
	}
	defer cli.Close()
	// vppapi and blockwatch name their component themselves; GoVPP's own logs go through slog too.
	vppapi.ForwardGoVPPLogs(log)
	vpp, err := vppapi.New(vppapi.Config{Socket: cfg.vppSocket, ReplyTimeout: cfg.vppTimeout, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	watcher, err := blockwatch.New(blockwatch.Config{Client: cli, BlockPrefix: cfg.etcd.blockPrefix, HostsPrefix: cfg.etcd.hostsPrefix,
		LegacyHostAffinity: cfg.etcd.legacyHostAffinity, RequestTimeout: cfg.etcd.RequestTimeout,
		Ownership: blockwatch.Ownership(cfg.etcd.ownership), NodeName: cfg.node, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	m := agent.NewMetrics(reg)
	var registrar *agent.Registrar
	var registration agent.Registration
	if !cfg.agent.DryRun {
		registrar, err = agent.NewRegistrar(agent.RegistrarConfig{Client: cli, HostsPrefix: cfg.etcd.hostsPrefix, NodeName: cfg.node,
			PeerIPs: cfg.peerIPs, BFDPeerIPs: cfg.bfdPeerIPs(), TTL: cfg.registrationTTL, Deregister: cfg.deregisterOnExit, RequestTimeout: cfg.etcd.RequestTimeout,
			Logger: log.With("component", "registration"), Metrics: m})
		if err != nil {
			return err
		}
		registration = registrar
	}
	cfg.agent.Logger = log.With("component", "agent")
	// The guard keeps the client off frozen members and tells readiness when etcd cannot serve.
	guard := etcdconfig.NewGuard(&cfg.etcd.Config, cli, log)
	cfg.agent.EtcdHealth = guard
	a, err := agent.New(cfg.agent, vpp, watcher, registration, m)
	if err != nil {
		return err
	}

	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	g, gctx := errgroup.WithContext(runCtx)
	// The VPP connection outlives the reconciler: --withdraw-on-exit deletes the routes after a.Run
	// has seen the cancellation, so the connection closes only once a.Run has returned.
	vppCtx, stopVPP := context.WithCancel(context.Background())
	defer stopVPP()
	g.Go(func() error { return vpp.Run(vppCtx) })
	g.Go(func() error { return watcher.Run(gctx) })
	g.Go(func() error { return guard.Run(gctx) })
	g.Go(func() error { reportCertificateErrors(gctx, &cfg.etcd.Config, watcher, log); return nil })
	g.Go(func() error {
		defer stopVPP()
		return a.Run(gctx)
	})
	if registrar != nil {
		g.Go(func() error { return registrar.Run(gctx) })
	}
	g.Go(func() error {
		if waitResynced(gctx, a) {
			stopProfile()
			if cfg.gcPercent > 0 {
				debug.SetGCPercent(cfg.gcPercent)
			}
		}
		return nil
	})
	if cfg.metricsAddress != "" {
		ln, err := net.Listen("tcp", cfg.metricsAddress)
		if err != nil {
			return fmt.Errorf("--metrics-address %s: %w", cfg.metricsAddress, err)
		}
		log.Info("serving metrics and health", "address", ln.Addr().String())
		srv := &http.Server{Handler: httpHandler(a, reg), ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := httpserve.Until(gctx, srv, ln, time.Second); err != nil {
				return fmt.Errorf("metrics server: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error { return signalLoop(gctx, a, log) })
	g.Go(func() error { notifyLoop(gctx, a, log); return nil })

	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	select {
	case err := <-done: // a component failed on its own
		return err
	case <-ctx.Done():
	}
	log.Info("stopping", "withdraw_on_exit", cfg.agent.WithdrawOnExit, "deregister_on_exit", cfg.deregisterOnExit)
	sdnotify.Notify("STOPPING=1")
	cancelRun()
	limit := shutdownLimit
	if cfg.agent.WithdrawOnExit {
		limit += agent.WithdrawTimeout
	}
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		return fmt.Errorf("shutdown did not finish within %s", limit)
	}
}

// certCheckInterval is how often, while the watch is out of sync, the endpoints are probed for a
// certificate problem (tests shorten it).
var certCheckInterval = 10 * time.Second

// reportCertificateErrors logs at ERROR, once per distinct message, a certificate problem that appears
// after start (etcd was down at start, or its certificate changed): gRPC itself reports it only as
// request deadlines. The agent keeps running and keeps its routes.
func reportCertificateErrors(ctx context.Context, cfg *etcdconfig.Config, w *blockwatch.Watcher, log *slog.Logger) {
	if !strings.HasPrefix(cfg.Endpoints[0], "https://") {
		return
	}
	tick := time.NewTicker(certCheckInterval)
	defer tick.Stop()
	last := ""
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if w.Status().Synced {
			last = ""
			continue
		}
		err := cfg.Probe(ctx)
		if err == nil || !errors.Is(err, etcdconfig.ErrCertificate) || err.Error() == last {
			continue
		}
		last = err.Error()
		log.Error("etcd TLS certificate problem: the agent cannot read etcd until it is fixed; routes stay as they are", "err", err)
	}
}

// signalLoop turns SIGHUP into a relist and full resync.
func signalLoop(ctx context.Context, a *agent.Agent, log *slog.Logger) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
			log.Info("SIGHUP: relisting etcd and resyncing the FIB")
			a.Relist()
		}
	}
}

// waitResynced waits until the agent's first full resync is done (true) or ctx is done (false); the
// cold start ends there: the Go GC target goes to its steady value, a startup CPU profile is written.
func waitResynced(ctx context.Context, a *agent.Agent) bool {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for !a.Resynced() {
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
	return true
}

// startupCPUProfileEnv names a file for a CPU profile of the cold start (see daemonConfig).
const startupCPUProfileEnv = "VPP_ROUTE_AGENT_STARTUP_CPUPROFILE"

// startCPUProfile starts a CPU profile into file path and returns what stops it, closes the file and
// writes the allocations so far to path.allocs (pprof -sample_index alloc_space), safe to call more than once.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", startupCPUProfileEnv, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", startupCPUProfileEnv, err)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			f.Close()
			if a, err := os.Create(path + ".allocs"); err == nil {
				_ = pprof.Lookup("allocs").WriteTo(a, 0)
				a.Close()
			}
		})
	}, nil
}

// notifyLoop tells systemd READY=1 once the first full resync is done, and pets the watchdog while the
// reconcile loop turns.
func notifyLoop(ctx context.Context, a *agent.Agent, log *slog.Logger) {
	wd := sdnotify.WatchdogInterval()
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	ready := false
	var lastPet time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if !ready {
			if a.Resynced() {
				ready = true
				if sent, err := sdnotify.Notify("READY=1\nSTATUS=first full resync done"); err != nil {
					log.Warn("sd_notify READY failed", "err", err)
				} else if sent {
					log.Info("notified systemd: ready")
				}
			}
		}
		if wd > 0 && time.Since(lastPet) >= wd && a.HealthyWithin(wd) {
			sdnotify.Notify("WATCHDOG=1")
			lastPet = time.Now()
		}
	}
}

// httpHandler serves /metrics, /healthz, /readyz and /debug/routes.
func httpHandler(a *agent.Agent, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if !a.HealthyWithin(30 * time.Second) {
			http.Error(w, "reconcile loop stalled", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ok, missing := a.Ready()
		notes := ""
		if n := a.Notes(); len(n) > 0 {
			notes = "note (not a readiness condition):\n- " + strings.Join(n, "\n- ") + "\n"
		}
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready:\n- %s\n%s", strings.Join(missing, "\n- "), notes)
			return
		}
		fmt.Fprintf(w, "ready\n%s", notes)
	})
	mux.HandleFunc("GET /debug/routes", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		doc, err := a.DebugJSON(ctx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(doc) // shared between requests: never appended to
		w.Write([]byte("\n"))
	})
	return mux
}

// parseUplinks returns the uplinks named by --uplink-interface (repeatable), or the one of
// --uplink-sw-if-index.
func parseUplinks(names []string, index int64, indexGiven bool) ([]vppapi.Uplink, error) {
	switch {
	case len(names) > 0 && indexGiven:
		return nil, errors.New("--uplink-interface and --uplink-sw-if-index are exclusive")
	case len(names) > 0:
		var out []vppapi.Uplink
		for i, n := range names {
			if n == "" {
				return nil, fmt.Errorf("--uplink-interface: entry %d is empty", i+1)
			}
			if j := slices.Index(names, n); j < i {
				return nil, fmt.Errorf("--uplink-interface: %s is given twice (uplinks %d and %d)", n, j+1, i+1)
			}
			out = append(out, vppapi.Uplink{Name: n})
		}
		return out, nil
	case index >= 0 && index < 1<<32-1:
		return []vppapi.Uplink{{SwIfIndex: uint32(index), HasIndex: true}}, nil
	case indexGiven:
		return nil, fmt.Errorf("--uplink-sw-if-index: %d is not a valid sw_if_index", index)
	}
	return nil, errors.New("--uplink-interface or --uplink-sw-if-index is required")
}

// perUplink splits the entries of flag (--uplink-address, --peer-ip) among n uplinks: with one, every
// entry is its (as before several uplinks existed); with several, entry i is uplink i's, or there is
// none at all. Within an entry, '+' joins the addresses of one uplink (pflag's repeatable flags and their
// environment forms split on commas already). An uplink has at most one address per family, and an
// address belongs to one uplink.
func perUplink[T any](flag string, entries []string, n int, parse func(string) (T, error), addrOf func(T) netip.Addr) ([][]T, error) {
	out := make([][]T, n)
	if len(entries) == 0 {
		return out, nil
	}
	if n > 1 && len(entries) != n {
		return nil, fmt.Errorf("%s: %d entries for %d uplinks (--uplink-interface): give one per uplink, in the same order, the addresses of one uplink joined by '+'",
			flag, len(entries), n)
	}
	owner := map[netip.Addr]int{}
	for i, e := range entries {
		u := i
		if n == 1 {
			u = 0
		}
		for _, f := range strings.Split(e, "+") {
			v, err := parse(strings.TrimSpace(f))
			if err != nil {
				return nil, fmt.Errorf("%s: %w", flag, err)
			}
			a := addrOf(v).Unmap()
			if j, dup := owner[a]; dup && j != u {
				return nil, fmt.Errorf("%s: %s is given for uplinks %d and %d", flag, a, j+1, u+1)
			}
			owner[a] = u
			for _, prev := range out[u] {
				if addrOf(prev).Unmap().Is4() == a.Is4() {
					return nil, fmt.Errorf("%s: %v and %v are of one family; give at most one per family and uplink", flag, prev, v)
				}
			}
			out[u] = append(out[u], v)
		}
	}
	return out, nil
}
