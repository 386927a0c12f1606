// Command block-ipamd is block-ipam's node daemon (package cni/ipamd): it owns the node's IPAM state
// on one etcd client and answers the block-ipam CNI plugin over a unix socket. `block-ipam daemon`
// runs it too. See docs/block-ipam.md for the flags, metrics and operations.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"

	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
	"github.com/vpp-route-agent/vpp-route-agent/cni/release"
	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
	"github.com/vpp-route-agent/vpp-route-agent/internal/buildinfo"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdconfig"
	"github.com/vpp-route-agent/vpp-route-agent/internal/flagenv"
	"github.com/vpp-route-agent/vpp-route-agent/internal/httpserve"
	"github.com/vpp-route-agent/vpp-route-agent/internal/logging"
	"github.com/vpp-route-agent/vpp-route-agent/internal/sdnotify"
)

// Defaults of the flags without a library default.
const (
	defaultMetricsAddress = "127.0.0.1:9483"
	// shutdownLimit bounds how long a stop may take after SIGTERM.
	shutdownLimit = 10 * time.Second
	// PauseEnv names the test hook: a duration the daemon sleeps before every etcd write, after
	// writing "block-ipam: test pause before commit" to stderr, so that a test can kill it there.
	// Never set it in production.
	PauseEnv = "BLOCK_IPAM_TEST_PAUSE"
)

func main() {
	singleThreaded()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	var err error
	if len(os.Args) > 1 && os.Args[1] == "release-node" {
		err = releaseNodeCmd(ctx, os.Args[2:], os.Stdout, os.Stderr, os.LookupEnv)
	} else {
		err = run(ctx, os.Args[1:], os.Stderr, os.LookupEnv)
	}
	stop()
	switch {
	case err == nil, errors.Is(err, pflag.ErrHelp):
	case errors.As(err, new(usageError)):
		fmt.Fprintln(os.Stderr, "block-ipamd:", err)
		os.Exit(2)
	default:
		fmt.Fprintln(os.Stderr, "block-ipamd:", err)
		os.Exit(1)
	}
}

// usageError is a bad flag or setting: exit status 2, nothing was opened.
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

// config is the daemon's validated command line.
type config struct {
	etcd           etcdconfig.Config
	node           string
	socket         string
	maxConns       int
	metricsAddress string
	log            *slog.Logger
	pause          time.Duration
	// livenessTTL and capacityInterval: the liveness lease and the capacity gauges' reads.
	livenessTTL      time.Duration
	capacityInterval time.Duration
	hostsPrefix      string
	// releaseAfter: release nodes dead for longer (0: never).
	releaseAfter time.Duration
}

// flagEnv names the daemon's environment fall-backs: Calico's names, else BLOCK_IPAM_<FLAG>
// (--max-connections: BLOCK_IPAM_MAX_CONNECTIONS).
var flagEnv = flagenv.Env{Prefix: "BLOCK_IPAM_", Calico: etcdconfig.CalicoEnv}

// parseFlags parses and validates the command line and environment; it opens no connection.
func parseFlags(args []string, stderr io.Writer, lookup func(string) (string, bool)) (*config, error) {
	fs := pflag.NewFlagSet("block-ipamd", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := &config{}
	cfg.etcd.BindFlags(fs)
	nodename := fs.String("nodename", "", "this node's name; else "+flagenv.NodenameFile+", else the lower-cased hostname")
	fs.StringVar(&cfg.socket, "socket", cni.DefaultSocket, "unix socket the CNI plugin connects to (the network configuration's ipam.socket)")
	// Removed: refused with the reason rather than ignored, so that a setting left in an environment
	// file is not silently dropped.
	group := fs.String("socket-group", "", "removed")
	fs.MarkHidden("socket-group")
	fs.IntVar(&cfg.maxConns, "max-connections", ipamd.DefaultMaxConnections, "plugin connections served at once; at the limit a new one displaces the oldest still waiting for its request")
	fs.StringVar(&cfg.metricsAddress, "metrics-address", defaultMetricsAddress, "listen address of /metrics, /healthz, /readyz; empty disables")
	fs.DurationVar(&cfg.livenessTTL, "liveness-ttl", ipamd.DefaultLivenessTTL, "TTL of the lease holding this daemon's liveness key "+ipamd.AlivePrefix+"<node> (whole seconds); the daemons elect the exporter of the cluster's capacity gauges on it")
	fs.DurationVar(&cfg.capacityInterval, "capacity-interval", ipamd.DefaultCapacityInterval, "how often the capacity gauges are read from etcd")
	fs.StringVar(&cfg.hostsPrefix, "hosts-prefix", ipamd.DefaultHostsPrefix, "the route agents' registration prefix: a node registered there counts as alive in block_ipam_dead_nodes")
	fs.DurationVar(&cfg.releaseAfter, "release-dead-nodes-after", 0, "on the elected daemon, release the addresses of nodes that have had neither liveness key nor registration for longer than this (as block-ipam release-node --yes); 0 never")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	format := fs.String("log-format", "text", "text or json")
	version := fs.Bool("version", false, "print the version and exit")
	flagEnv.Annotate(fs)
	if err := fs.Parse(args); err != nil {
		return nil, usageError{err}
	}
	if *version {
		fmt.Fprintln(stderr, "block-ipamd", buildinfo.Version)
		return nil, pflag.ErrHelp
	}
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))}
	}
	if err := flagEnv.Apply(fs, lookup); err != nil {
		return nil, usageError{err}
	}
	bad := func(err error) (*config, error) { return nil, usageError{err} }
	if err := cfg.etcd.ReadPassword(lookup); err != nil {
		return bad(err)
	}
	if err := cfg.etcd.Validate(); err != nil {
		return bad(err)
	}
	if err := checkPorts(cfg.etcd.Endpoints); err != nil {
		return bad(err)
	}
	node, err := flagenv.NodeName(*nodename, flagenv.NodenameFile)
	if err != nil {
		return bad(err)
	}
	cfg.node = node
	if why := shim.CheckSocketPath(cfg.socket); why != "" {
		return bad(fmt.Errorf("--socket %s", why))
	}
	if cfg.maxConns < 1 {
		return bad(fmt.Errorf("--max-connections %d: at least 1", cfg.maxConns))
	}
	if *group != "" {
		return bad(fmt.Errorf("--socket-group (%s) was removed: the socket is 0600, for root (the runtime executing the plugin) only; "+
			"the shipped unit forbids chown and the DaemonSet's container has no CAP_CHOWN, so no other group could be given it", flagEnv.Name("socket-group")))
	}
	if cfg.metricsAddress != "" {
		if err := checkListen(cfg.metricsAddress); err != nil {
			return bad(fmt.Errorf("--metrics-address: %w", err))
		}
	}
	if cfg.livenessTTL < ipamd.MinLivenessTTL || cfg.livenessTTL%time.Second != 0 {
		return bad(fmt.Errorf("--liveness-ttl %s: a whole number of seconds, at least %s", cfg.livenessTTL, ipamd.MinLivenessTTL))
	}
	if cfg.releaseAfter != 0 && cfg.releaseAfter < 2*cfg.livenessTTL {
		return bad(fmt.Errorf("--release-dead-nodes-after %s: 0 (off), or at least twice --liveness-ttl (%s), so that a daemon restarting is not taken for dead", cfg.releaseAfter, cfg.livenessTTL))
	}
	if cfg.capacityInterval < time.Second {
		return bad(fmt.Errorf("--capacity-interval %s: at least 1s", cfg.capacityInterval))
	}
	if cfg.log, err = logging.New(*level, *format, stderr); err != nil {
		return bad(err)
	}
	if v, ok := lookup(PauseEnv); ok {
		if cfg.pause, err = time.ParseDuration(v); err != nil {
			return bad(fmt.Errorf("%s: %w", PauseEnv, err))
		}
	}
	return cfg, nil
}

// checkPorts refuses an endpoint whose port is not a number in 1-65535.
func checkPorts(endpoints []string) error {
	for _, ep := range endpoints {
		hostport := strings.TrimPrefix(strings.TrimPrefix(ep, "https://"), "http://")
		hostport = strings.TrimSuffix(hostport, "/")
		if _, port, err := net.SplitHostPort(hostport); err == nil {
			if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
				return fmt.Errorf("--%s: %s: port %q is not in 1-65535", etcdconfig.FlagEndpoints, etcdconfig.Redacted([]string{ep}), port)
			}
		}
	}
	return nil
}

// checkListen validates a host:port listen address.
func checkListen(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%s: port %q is not in 0-65535", addr, port)
	}
	if host != "" && host != "localhost" && net.ParseIP(host) == nil {
		return fmt.Errorf("%s: %q is not an IP address", addr, host)
	}
	return nil
}

// singleThreaded runs Go code on one OS thread at a time unless GOMAXPROCS says otherwise. The daemon's
// work is one state goroutine and short requests: with a thread per core, every hand-off between its
// goroutines (a request, the state loop, gRPC's reader and writer) wakes another thread. On one,
// a DEL's request costs the daemon 0.65 ms of CPU instead of 0.90-0.95 and is answered in 1.08-1.14 ms
// instead of 1.31-1.43 (cni BenchmarkAddDel, two runs each); 100 concurrent ADDs take the same time.
func singleThreaded() {
	if _, set := os.LookupEnv("GOMAXPROCS"); !set {
		runtime.GOMAXPROCS(1)
	}
}

func run(ctx context.Context, args []string, stderr io.Writer, lookup func(string) (string, bool)) error {
	cfg, err := parseFlags(args, stderr, lookup)
	if err != nil {
		return err
	}
	log := cfg.log
	endpoints := etcdconfig.Redacted(cfg.etcd.Endpoints)
	log.Info("starting block-ipam daemon", "version", buildinfo.Version, "node", cfg.node, "etcd", endpoints, "socket", cfg.socket)

	// The metrics address is taken before any connection opens, so that a bad or busy one fails first.
	var metricsLn net.Listener
	if cfg.metricsAddress != "" {
		if metricsLn, err = net.Listen("tcp", cfg.metricsAddress); err != nil {
			return fmt.Errorf("--metrics-address %s: %w", cfg.metricsAddress, err)
		}
		defer metricsLn.Close()
	}

	// An etcd that is down only delays readiness (requests fail with 11 meanwhile); a certificate
	// problem stops the daemon now.
	cli, err := cfg.etcd.Connect(ctx, log)
	if err != nil {
		return err
	}
	defer cli.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The guard keeps the client off frozen members and tells the daemon when etcd cannot serve.
	guard := etcdconfig.NewGuard(&cfg.etcd, cli, log)
	dcfg := ipamd.Config{Node: cfg.node, Client: cli, Endpoints: endpoints, CallTimeout: cfg.etcd.RequestTimeout,
		Logger: log, Registerer: reg, EtcdHealth: guard, MaxConnections: cfg.maxConns}
	if cfg.pause > 0 {
		dcfg.Pause = func(ctx context.Context) {
			fmt.Fprintln(os.Stderr, "block-ipam: test pause before commit")
			select {
			case <-time.After(cfg.pause):
			case <-ctx.Done():
			}
		}
	}
	srv, err := ipamd.New(dcfg)
	if err != nil {
		return err
	}
	sock, err := ipamd.Listen(cfg.socket)
	if err != nil {
		return err
	}
	// Removes the socket only if its path still names it (a successor's is left alone).
	defer sock.Close()

	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	g, gctx := errgroup.WithContext(runCtx)
	g.Go(func() error { return srv.Run(gctx) })
	// With several endpoints, keep the client off a member that stopped answering (frozen, sockets
	// open), as the agent does; with any number, notice an etcd that cannot serve.
	g.Go(func() error { return guard.Run(gctx) })
	g.Go(func() error { return srv.Serve(gctx, sock) })
	live, err := ipamd.NewLiveness(ipamd.LivenessConfig{Client: cli, Node: cfg.node, TTL: cfg.livenessTTL,
		CallTimeout: cfg.etcd.RequestTimeout, Logger: log})
	if err != nil {
		return err
	}
	capacity := ipamd.NewCapacity(ipamd.CapacityConfig{Client: cli, Node: cfg.node, Leader: live.Leader,
		Interval: cfg.capacityInterval, CallTimeout: cfg.etcd.RequestTimeout, HostsPrefix: cfg.hostsPrefix, Exclude: srv.Exclude, Logger: log}, reg)
	g.Go(func() error { return live.Run(gctx) })
	g.Go(func() error { return capacity.Run(gctx) })
	if cfg.releaseAfter > 0 {
		reaper, err := release.NewReaper(release.ReaperConfig{Client: cli, Node: cfg.node, After: cfg.releaseAfter, Leader: live.Leader,
			HostsPrefix: cfg.hostsPrefix, CallTimeout: cfg.etcd.RequestTimeout, Logger: log}, reg)
		if err != nil {
			return err
		}
		log.Info("releasing the addresses of dead nodes", "after", cfg.releaseAfter)
		g.Go(func() error { return reaper.Run(gctx) })
	}
	if metricsLn != nil {
		log.Info("serving metrics and health", "address", metricsLn.Addr().String())
		hs := &http.Server{Handler: srv.HealthHandler(reg), ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error { return httpserve.Until(gctx, hs, metricsLn, 5*time.Second) })
	}
	if _, err := sdnotify.Notify("READY=1"); err != nil {
		log.Warn("systemd notify", "err", err)
	}
	if d := sdnotify.WatchdogInterval(); d > 0 {
		// Pet only while the state loop is alive (idle, or within the deadline of the operation it
		// runs): a stalled loop lets systemd restart the daemon.
		g.Go(func() error {
			t := time.NewTicker(d)
			defer t.Stop()
			for {
				select {
				case <-gctx.Done():
					return nil
				case <-t.C:
				}
				if srv.HealthyWithin(d) {
					sdnotify.Notify("WATCHDOG=1")
				}
			}
		})
	}

	done := make(chan error, 1)
	go func() { done <- g.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	log.Info("stopping")
	sdnotify.Notify("STOPPING=1")
	cancelRun()
	select {
	case err := <-done:
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		return err
	case <-time.After(shutdownLimit):
		return fmt.Errorf("shutdown did not finish within %s", shutdownLimit)
	}
}
