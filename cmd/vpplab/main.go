// Command vpplab runs the whole system on one machine: an embedded etcd, N VPP nodes (simulated, or
// real VPP processes with --vpp), one real vpp-route-agent and one block-ipam daemon (block-ipamd)
// process per node, and the block-ipam plugin (the built binary, called through libcni as a container
// runtime calls it) placing pods so that nodes claim blocks. It then plays a scenario and
// checks every node's FIB against the desired state after each step. With --vpp of a lab build (memif
// and ping plugins) the nodes are wired through a router VPP, one of them in another subnet, and every
// step also pings pod to pod, the pings that must pass and those that must fail. With --prometheus it
// runs Debian's Prometheus scraping every daemon with the shipped alert rules (deploy/monitoring), and
// --exhaust-pool fills a small IPv4 pool (--ipv4-pool) until block-ipam refuses a pod, so that its
// alerts fire on a live system.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, pflag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "vpplab:", err)
		os.Exit(1)
	}
}

// options are the lab's flags.
type options struct {
	nodes       int
	pods        int
	keepRunning bool
	dataDir     string
	binDir      string
	settle      time.Duration
	// vppPkg is an unpacked VPP package directory (--vpp): every node runs a real VPP from it.
	vppPkg string
	vppBin vppproc.Binaries
	// wired says that vppPkg is a lab build (memif and ping plugins): the nodes are then wired through a
	// router VPP (internal/vpptopo) and every step pings pod to pod.
	wired bool
	// ipv4Pool is the IPv4 pool's CIDR (--ipv4-pool); exhaustPool adds the step that fills it.
	ipv4Pool    netip.Prefix
	exhaustPool bool
	// promMode is --prometheus (yes, no, auto); promBin the Prometheus binary the lab runs, "" for
	// none; promAddr its listen address; alertFor the `for` of every alert rule, negative for the
	// shipped ones (--alert-for).
	promMode string
	promBin  string
	promAddr string
	alertFor time.Duration
}

// maxExhaustAddresses bounds the pool --exhaust-pool fills: one ADD per address.
const maxExhaustAddresses = 1024

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("vpplab", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	fs.IntVar(&o.nodes, "nodes", 3, "number of simulated VPP nodes (2-9)")
	fs.IntVar(&o.pods, "pods", 6, "pods placed on each node at the start")
	fs.BoolVar(&o.keepRunning, "keep-running", false, "leave the lab up after the scenario, until Ctrl-C")
	fs.StringVar(&o.dataDir, "data-dir", "", "directory for etcd data, sockets and logs (default: a new temporary directory)")
	fs.StringVar(&o.binDir, "bin-dir", "", "directory holding vpp-route-agent, block-ipam and block-ipamd (default: beside vpplab)")
	fs.DurationVar(&o.settle, "settle-timeout", 15*time.Second, "how long a step may take to converge before it FAILs")
	fs.StringVar(&o.vppPkg, "vpp", "", "run every node on a real VPP from this unpacked package directory (bin/vpp, bin/vppctl); "+
		"a lab build with the memif and ping plugins (/opt/vpp-v26.06-lab) wires the nodes through a router VPP and pings pod to pod at every step; default: the simulator")
	pool := fs.String("ipv4-pool", labPoolV4.CIDR.String(), fmt.Sprintf("CIDR of the lab's IPv4 pool (blocks of /%d); 10.244.0.0/26 holds the scenario's pods and fills fast", labPoolV4.BlockSize))
	fs.BoolVar(&o.exhaustPool, "exhaust-pool", false, fmt.Sprintf("after the scenario, place pods on node-1 until block-ipam refuses one: the IPv4 pool exhausted (at most %d addresses: a small --ipv4-pool)", maxExhaustAddresses))
	prom := fs.String("prometheus", "auto", "run Debian's Prometheus (prometheus on PATH) scraping every daemon with deploy/monitoring/rules.yml: yes, no, "+
		"or auto (yes with --keep-running when installed); bare --prometheus means yes")
	fs.Lookup("prometheus").NoOptDefVal = "yes"
	fs.StringVar(&o.promAddr, "prometheus-address", "", "listen address of the lab's Prometheus (default: a free loopback port)")
	alertFor := fs.String("alert-for", "", "replace the 'for' of every alert rule the lab's Prometheus loads (0s: alerts fire at once); default: as shipped")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: vpplab [flags]\n\nRuns etcd, --nodes simulated VPP nodes with one vpp-route-agent each, "+
			"places pods with block-ipam,\nand plays a scenario checking every FIB. Exit status 1 on any FAIL.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.nodes < 2 || o.nodes > 9 {
		return fmt.Errorf("--nodes: %d is outside 2-9", o.nodes)
	}
	if o.pods < 1 || o.pods > 200 {
		return fmt.Errorf("--pods: %d is outside 1-200", o.pods)
	}
	if err := o.parsePool(*pool); err != nil {
		return err
	}
	if err := o.parsePrometheus(*prom, *alertFor); err != nil {
		return err
	}
	if o.vppPkg != "" {
		var err error
		if o.vppBin, err = vppproc.FromPackage(o.vppPkg); err != nil {
			return fmt.Errorf("--vpp: %w", err)
		}
		o.wired = vpptopo.HasLabPlugins(o.vppBin) == nil
	}
	if o.binDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("--bin-dir: %w", err)
		}
		o.binDir = filepath.Dir(exe)
	}
	for _, b := range []string{"vpp-route-agent", "block-ipam", "block-ipamd"} {
		if _, err := os.Stat(filepath.Join(o.binDir, b)); err != nil {
			return fmt.Errorf("--bin-dir: %s not found in %s (run `make build` first): %w", b, o.binDir, err)
		}
	}
	if o.dataDir == "" {
		d, err := os.MkdirTemp("", "vpplab-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		o.dataDir = d
	} else if err := os.MkdirAll(o.dataDir, 0o755); err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	lab, err := newLab(ctx, o, stdout)
	if err != nil {
		return err
	}
	defer lab.close()
	failed := lab.scenario(ctx)
	lab.summary()
	if o.keepRunning && ctx.Err() == nil {
		lab.printHowTo()
		<-ctx.Done()
		fmt.Fprintln(stdout, "\nstopping the lab")
	}
	if failed > 0 {
		return fmt.Errorf("%d step(s) FAILED", failed)
	}
	return nil
}

// parsePool validates --ipv4-pool and --exhaust-pool.
func (o *options) parsePool(cidr string) error {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return fmt.Errorf("--ipv4-pool: %w", err)
	}
	if !p.Addr().Is4() || p != p.Masked() || p.Bits() > labPoolV4.BlockSize {
		return fmt.Errorf("--ipv4-pool: %s is not an IPv4 network of /%d blocks (e.g. 10.244.0.0/26)", cidr, labPoolV4.BlockSize)
	}
	if o.exhaustPool && calico.Size(p) > maxExhaustAddresses {
		return fmt.Errorf("--exhaust-pool: the pool %s holds %d addresses, more than the %d the lab fills; give a smaller --ipv4-pool, e.g. 10.244.0.0/26", p, calico.Size(p), maxExhaustAddresses)
	}
	o.ipv4Pool = p
	return nil
}

// parsePrometheus resolves --prometheus to the binary to run and validates --alert-for. auto runs
// Prometheus only with --keep-running: a lab that stops seconds after its scenario leaves nothing to
// look at, and the tests' labs need not pay for it.
func (o *options) parsePrometheus(mode, alertFor string) error {
	o.alertFor, o.promMode = -1, mode
	if alertFor != "" {
		d, err := time.ParseDuration(alertFor)
		if err != nil || d < 0 || d%time.Second != 0 {
			return fmt.Errorf("--alert-for: %q is not a whole number of seconds, 0s or more", alertFor)
		}
		o.alertFor = d
	}
	switch mode {
	case "no":
		return nil
	case "yes", "auto":
	default:
		return fmt.Errorf("--prometheus: %q is not yes, no or auto", mode)
	}
	bin, err := exec.LookPath("prometheus")
	switch {
	case err != nil && mode == "yes":
		return fmt.Errorf("--prometheus: %w (Debian's package: make promtool, or apt-get install --no-install-recommends prometheus)", err)
	case err == nil && (mode == "yes" || o.keepRunning):
		o.promBin = bin
	}
	return nil
}
