// Command vpplab runs the whole system on one machine: an embedded etcd, N VPP nodes (simulated, or
// real VPP processes with --vpp), one real vpp-route-agent and one block-ipam daemon (block-ipamd)
// process per node, and the block-ipam plugin (the built binary, called through libcni as a container
// runtime calls it) placing pods so that nodes claim blocks. It then plays a scenario and
// checks every node's FIB against the desired state after each step. With --vpp of a lab build (memif
// and ping plugins) the nodes are wired through a router VPP, one of them in another subnet, and every
// step also pings pod to pod, the pings that must pass and those that must fail.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/pflag"
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
}

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
