package cni

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// Secondary attribute keys block-ipam writes besides Calico's namespace, pod, node and timestamp.
const (
	// AttrIfname is the container interface an address belongs to: Calico's handle is per container,
	// so two interfaces of one container on one network share it and are told apart by this key. An
	// allocation without it (written by calico-ipam) belongs to "eth0".
	AttrIfname = "ifname"
	// AttrNetwork is the CNI network name, so that GC recognises its own allocations exactly even
	// when one network's name is a dotted prefix of another's.
	AttrNetwork = "network"
	// defaultIfname is the interface of allocations that carry no AttrIfname.
	defaultIfname = "eth0"
)

// PauseEnv names the test hook: when set to a duration, the plugin writes "block-ipam: test pause
// before commit" to stderr and sleeps that long between its reads and its write (GC: between its
// snapshot and its releases), so that a test can kill it or change the data there. Never set it in
// production.
const PauseEnv = "BLOCK_IPAM_TEST_PAUSE"

// maxAttempts bounds the retries of one operation (Calico allows 100); the deadline usually ends
// them first.
const maxAttempts = 100

// call is one invocation of the plugin: its configuration, etcd client and logger.
type call struct {
	conf  *Config
	etcd  *etcdClient
	log   *slog.Logger
	pause func(context.Context)
	// cache is the node cache, loaded once the node lock is held (empty until then).
	cache *nodeCache
	// attempts counts the optimistic attempts of the operation (1 when no race was lost; 0 when
	// another ADD's group commit served this one).
	attempts int
	// batched counts the other ADDs this one served in its write (group commit).
	batched int
}

// CmdAdd implements CNI ADD.
func CmdAdd(args *skel.CmdArgs) error { return run(args, "ADD") }

// CmdDel implements CNI DEL.
func CmdDel(args *skel.CmdArgs) error { return run(args, "DEL") }

// CmdCheck implements CNI CHECK.
func CmdCheck(args *skel.CmdArgs) error { return run(args, "CHECK") }

// CmdGC implements CNI GC.
func CmdGC(args *skel.CmdArgs) error { return run(args, "GC") }

// CmdStatus implements CNI STATUS.
func CmdStatus(args *skel.CmdArgs) error { return run(args, "STATUS") }

// run loads the configuration (no etcd call before it is valid), sets up logging and the etcd
// client, runs the verb under the configured deadline and maps its error to a CNI code. A panic
// becomes error 999: the runtime must always get protocol output.
func run(args *skel.CmdArgs, verb string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(os.Stderr, "block-ipam %s: panic: %v\n%s", verb, r, debug.Stack())
			err = &types.Error{Code: types.ErrInternal, Msg: fmt.Sprintf("block-ipam %s: internal error: %v", verb, r)}
		}
	}()
	conf, err := LoadConfig(args.StdinData, args.Args, os.Getenv, os.Hostname)
	if err != nil {
		return err
	}
	log, closeLog := newLogger(conf)
	defer closeLog()
	etcd, err := newEtcdClient(conf.Endpoints, conf.tls, callTimeout)
	if err != nil {
		return err
	}
	defer etcd.close()
	c := &call{conf: conf, etcd: etcd, log: log, cache: &nodeCache{}}
	if d, perr := time.ParseDuration(os.Getenv(PauseEnv)); perr == nil && d > 0 {
		c.pause = func(ctx context.Context) {
			fmt.Fprintln(os.Stderr, "block-ipam: test pause before commit")
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
			}
		}
	}
	timeout := conf.Timeout
	if verb == "STATUS" {
		timeout = statusTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	start := time.Now()
	attrs := []any{"container", args.ContainerID, "ifname", args.IfName, "node", conf.Node, "network", conf.Network}
	switch verb {
	case "ADD":
		var res *current.Result
		res, err = c.add(ctx, args)
		if err == nil {
			attrs = append(attrs, "ips", resultIPs(res))
			err = types.PrintResult(res, conf.CNIVersion)
		}
	case "DEL":
		err = c.del(ctx, args)
	case "CHECK":
		err = c.check(ctx, args)
	case "GC":
		var released int
		released, err = c.gc(ctx)
		attrs = append(attrs, "released", released)
	case "STATUS":
		err = c.status(ctx)
	}
	attrs = append(attrs, "attempts", c.attempts, "batched", c.batched, "etcd_round_trips", etcd.roundTrips.Load(),
		"duration_ms", float64(time.Since(start).Microseconds())/1000)
	if err != nil {
		err = toCNIError(err)
		log.Error(verb+" failed", append(attrs, "err", err)...)
		return err
	}
	log.Info(verb, attrs...)
	return nil
}

// newLogger logs to log_file (appending) or stderr, never stdout: stdout carries the protocol.
func newLogger(c *Config) (*slog.Logger, func()) {
	var w io.Writer = os.Stderr
	closeFn := func() {}
	if c.LogFile != "" {
		f, err := os.OpenFile(c.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err == nil {
			w, closeFn = f, func() { f.Close() }
		} else {
			fmt.Fprintf(os.Stderr, "block-ipam: log_file %s: %v; logging to stderr\n", c.LogFile, err)
		}
	}
	var level slog.Level
	switch c.LogLevel {
	case "debug":
		level = slog.LevelDebug
	case "warn", "warning":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	default:
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})).With("pid", os.Getpid()), closeFn
}

// retry runs attempt until it succeeds, fails for good, or the deadline or maxAttempts ends it. Lost
// races (errConflict) and an unreachable etcd (errUnavailable) are retried after a capped, jittered
// exponential backoff; running out returns an error that maps to CNI code 11.
func (c *call) retry(ctx context.Context, what string, attempt func(context.Context) error) error {
	backoff := 2 * time.Millisecond
	var last error
	for c.attempts = 1; c.attempts <= maxAttempts; c.attempts++ {
		err := attempt(ctx)
		if err == nil {
			return nil
		}
		if !errors.Is(err, errConflict) && !errors.Is(err, errUnavailable) {
			return err
		}
		last = err
		c.log.Debug("retrying", "what", what, "attempt", c.attempts, "err", err)
		d := backoff/2 + rand.N(backoff/2+1)
		backoff = min(backoff*2, 250*time.Millisecond)
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s: gave up after %d attempts (%w): %w", what, c.attempts, ctx.Err(), last)
		}
	}
	return fmt.Errorf("%s: gave up after %d attempts: %w", what, maxAttempts, last)
}

// lock takes the node lock; a lock that cannot be set up (e.g. no writable /var/run) is skipped with a
// warning, since transactions keep the data correct without it.
func (c *call) lock(ctx context.Context) (*nodeLock, error) {
	l, err := acquireLock(ctx, c.conf.LockFile)
	if err == nil {
		c.cache = loadCache(cachePath(c.conf.LockFile, c.conf.Network), c.conf.cacheKey())
		return l, nil
	}
	if ctx.Err() != nil {
		return nil, err
	}
	c.log.Warn("running without the node lock", "err", err)
	return &nodeLock{}, nil
}

// handleID is Calico's handle for a container on a network: "<network>.<containerID>".
func handleID(network, containerID string) string { return network + "." + containerID }

// ifnameOf returns the interface an allocation belongs to.
func ifnameOf(a *calico.AllocationAttribute) string {
	if n := a.Secondary[AttrIfname]; n != "" {
		return n
	}
	return defaultIfname
}

// attribute is the allocation attribute of an ADD: Calico's handle and secondary attributes plus
// the interface and network.
func (c *call) attribute(handle, ifname string) calico.AllocationAttribute {
	sec := map[string]string{
		calico.AttrNode:      c.conf.Node,
		calico.AttrTimestamp: time.Now().UTC().String(),
		AttrIfname:           ifname,
		AttrNetwork:          c.conf.Network,
	}
	if c.conf.Namespace != "" {
		sec[calico.AttrNamespace] = c.conf.Namespace
	}
	if c.conf.Pod != "" {
		sec[calico.AttrPod] = c.conf.Pod
	}
	return calico.AllocationAttribute{HandleID: &handle, Secondary: sec}
}

// allocation is one address held in a block.
type allocation struct {
	block netip.Prefix
	addr  netip.Addr
}

// held returns the addresses of this (handle, ifname) in the blocks the handle lists (which must be
// loaded), IPv4 first.
func (v *view) held(handle, ifname string) []allocation {
	var out []allocation
	if v.handle == nil {
		return nil
	}
	for k := range v.handle.Block {
		cidr, err := netip.ParsePrefix(k)
		if err != nil {
			continue
		}
		e := v.blocks[calico.Canonical(cidr)]
		if e == nil {
			continue
		}
		for _, ord := range e.b.Ordinals(func(a *calico.AllocationAttribute) bool {
			return a.HeldBy(handle) && ifnameOf(a) == ifname
		}) {
			addr, _ := calico.OrdinalAddr(e.b.CIDR, ord)
			out = append(out, allocation{block: e.b.CIDR, addr: addr})
		}
	}
	sortAllocations(out)
	return out
}

func sortAllocations(a []allocation) {
	slices.SortFunc(a, func(x, y allocation) int { return x.addr.Compare(y.addr) })
}

// handleBlocks returns the block CIDRs a handle lists.
func handleBlocks(h *calico.Handle) []netip.Prefix {
	if h == nil {
		return nil
	}
	var out []netip.Prefix
	for k := range h.Block {
		if p, err := netip.ParsePrefix(k); err == nil {
			out = append(out, calico.Canonical(p))
		}
	}
	return out
}

// result builds the CNI result for the allocations: host prefixes (or the block's mask), the
// family's gateway, the configured routes and DNS.
func (c *call) result(allocs []allocation) *current.Result {
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion, Routes: c.conf.Routes, DNS: c.conf.DNS}
	for _, a := range allocs {
		bits := a.addr.BitLen()
		if c.conf.ResultBlock {
			bits = a.block.Bits()
		}
		ipc := &current.IPConfig{Address: net.IPNet{IP: net.IP(a.addr.AsSlice()), Mask: net.CIDRMask(bits, a.addr.BitLen())}}
		if gw := c.conf.Gateways[familyOf(a.addr)]; gw.IsValid() {
			ipc.Gateway = net.IP(gw.AsSlice())
		}
		res.IPs = append(res.IPs, ipc)
	}
	return res
}

func resultIPs(r *current.Result) string {
	var s []string
	for _, ip := range r.IPs {
		s = append(s, ip.Address.String())
	}
	return strings.Join(s, ",")
}
