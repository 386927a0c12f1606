package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"

	"github.com/spf13/pflag"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
	"github.com/vpp-route-agent/vpp-route-agent/cni/release"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdconfig"
	"github.com/vpp-route-agent/vpp-route-agent/internal/logging"
)

// releaseNodeCmd is `block-ipam release-node NODE` (block-ipam execs `block-ipamd release-node`: the
// plugin links no etcd client). It prints what releasing the node would do; with --yes it does it.
func releaseNodeCmd(ctx context.Context, args []string, stdout, stderr io.Writer, lookup func(string) (string, bool)) error {
	fs := pflag.NewFlagSet("block-ipam release-node", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var ec etcdconfig.Config
	ec.BindFlags(fs)
	hosts := fs.String("hosts-prefix", ipamd.DefaultHostsPrefix, "the route agents' registration prefix: a node registered there looks alive")
	yes := fs.Bool("yes", false, "release (without it: print what would be released and write nothing)")
	force := fs.Bool("force", false, "release a node that looks alive (liveness key or route agent registration)")
	output := fs.String("output", "table", "output format: table or json")
	level := fs.String("log-level", "warn", "debug, info, warn or error (on stderr)")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: block-ipam release-node [flags] NODE\n\n"+
			"Gives a dead node's addresses back: its pods' allocations and their handles, its host affinities,\n"+
			"its blocks (deleted when left empty, else left without owner). Dry run unless --yes. Refuses a\n"+
			"node that looks alive (%s<node> or a route agent registration) unless --force.\n\nFlags:\n", ipamd.AlivePrefix)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return usageError{err}
	}
	// Only the connection's settings come from the environment: an exported BLOCK_IPAM_FORCE must
	// never release a live node.
	if err := flagEnv.Apply(fs, lookup, "yes", "force", "output", "log-level"); err != nil {
		return usageError{err}
	}
	if fs.NArg() != 1 {
		return usageError{fmt.Errorf("want one node name, got %d arguments", fs.NArg())}
	}
	node := fs.Arg(0)
	if err := calico.CheckNodeName(node); err != nil {
		return usageError{err}
	}
	if *output != "table" && *output != "json" {
		return usageError{fmt.Errorf("--output: %q is not table or json", *output)}
	}
	log, err := logging.New(*level, "text", stderr)
	if err != nil {
		return usageError{err}
	}
	if err := ec.ReadPassword(lookup); err != nil {
		return usageError{err}
	}
	if err := ec.Validate(); err != nil {
		return usageError{err}
	}
	if err := checkPorts(ec.Endpoints); err != nil {
		return usageError{err}
	}
	if err := ec.Probe(ctx); errors.Is(err, etcdconfig.ErrCertificate) || errors.Is(err, etcdconfig.ErrNotTLS) ||
		etcdconfig.NoneReachable(err, len(ec.Endpoints)) {
		return err
	}
	cli, err := ec.Client()
	if err != nil {
		return err
	}
	defer cli.Close()
	o := release.Options{Client: cli, Node: node, HostsPrefix: *hosts, Force: *force, CallTimeout: ec.RequestTimeout,
		Logger: log, By: "block-ipam release-node by " + operator()}
	p, err := release.NewPlan(ctx, o)
	if err != nil {
		return fmt.Errorf("read node %s from etcd at %s: %w", node, etcdconfig.Redacted(ec.Endpoints), err)
	}
	if !*yes {
		if *output == "json" {
			return writeJSON(stdout, p)
		}
		printPlan(stdout, p, *force)
		return nil
	}
	if p.Empty() {
		if *output == "json" {
			return writeJSON(stdout, &release.Result{Node: node})
		}
		printPlan(stdout, p, *force)
		return nil
	}
	res, err := release.Commit(ctx, o, p)
	if res != nil {
		if *output == "json" {
			if jerr := writeJSON(stdout, res); jerr != nil {
				return jerr
			}
		} else {
			printResult(stdout, res)
		}
	}
	if err == nil && len(p.Skipped) > 0 {
		err = fmt.Errorf("node %s: %d values left as they are (named above): release what they hold by hand", node, len(p.Skipped))
	}
	if errors.Is(err, release.ErrAborted) {
		err = fmt.Errorf("%w; run release-node again", err)
	}
	return err
}

// operator names who runs the command, for the release record.
func operator() string {
	name := "unknown"
	if u, err := user.Current(); err == nil {
		name = u.Username
	}
	if h, err := os.Hostname(); err == nil {
		name += "@" + h
	}
	return name
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func describe(a release.Allocation) string {
	s := a.Addr.String()
	if a.Namespace != "" || a.Pod != "" {
		s += " " + a.Namespace + "/" + a.Pod
	}
	if a.Node != "" {
		s += " node " + a.Node
	}
	if a.Handle != "" {
		s += " handle " + a.Handle
	}
	return s
}

// printPlan prints a dry run.
func printPlan(w io.Writer, p *release.Plan, force bool) {
	fmt.Fprintf(w, "node %s: dry run at etcd revision %d (nothing written; --yes releases)\n", p.Node, p.Revision)
	if len(p.Alive) > 0 {
		verdict := "release-node --yes refuses it without --force"
		if force {
			verdict = "--force releases it all the same"
		}
		for _, s := range p.Alive {
			fmt.Fprintf(w, "looks alive: %s\n", s)
		}
		fmt.Fprintf(w, "  (%s)\n", verdict)
	}
	for _, b := range p.Blocks {
		owner := b.Owner
		if owner == "" {
			owner = "no owner"
		}
		fmt.Fprintf(w, "block %s (%s): %s", b.CIDR, owner, blockVerb(b))
		if b.AffinityKey != "" {
			fmt.Fprintf(w, "; affinity %s deleted", b.AffinityKey)
		}
		fmt.Fprintln(w)
		for _, a := range b.Release {
			fmt.Fprintf(w, "  release %s\n", describe(a))
		}
		for _, a := range b.Kept {
			fmt.Fprintf(w, "  keep    %s\n", describe(a))
		}
	}
	for _, o := range p.Orphans {
		fmt.Fprintf(w, "affinity %s (state %q, no block): deleted\n", o.Key, o.State)
	}
	for _, h := range p.Handles {
		switch {
		case h.Missing:
			fmt.Fprintf(w, "handle %s: absent (%d addresses held without one)\n", h.ID, h.Released)
		case h.Malformed:
			fmt.Fprintf(w, "handle %s: does not decode, left as it is\n", h.ID)
		case h.Delete:
			fmt.Fprintf(w, "handle %s: deleted (%d addresses)\n", h.ID, h.Released)
		default:
			fmt.Fprintf(w, "handle %s: %d addresses fewer\n", h.ID, h.Released)
		}
	}
	for _, s := range p.Skipped {
		fmt.Fprintf(w, "left as it is: %s: %s\n", s.Key, s.Reason)
	}
	if p.Empty() {
		what := "nothing to release"
		if p.LastRecord != "" {
			what += " (last release recorded at " + p.LastRecord + ")"
		}
		fmt.Fprintf(w, "node %s: %s\n", p.Node, what)
		return
	}
	fmt.Fprintf(w, "summary: %d addresses, %d blocks, %d orphan affinities, %d handles\n", p.Addresses(), len(p.Blocks), len(p.Orphans), len(p.Handles))
}

func blockVerb(b release.BlockPlan) string {
	switch b.Action {
	case release.BlockDelete:
		return fmt.Sprintf("release %d, delete the block", len(b.Release))
	case release.BlockUnown:
		return fmt.Sprintf("release %d, keep %d of others, affinity set to null", len(b.Release), len(b.Kept))
	case release.BlockUpdate:
		return fmt.Sprintf("release %d borrowed", len(b.Release))
	}
	return "not the node's block"
}

// printResult prints what a commit did.
func printResult(w io.Writer, r *release.Result) {
	for _, a := range r.Released {
		fmt.Fprintf(w, "released %s\n", describe(a))
	}
	list := func(what string, n int, items string) {
		if n > 0 {
			fmt.Fprintf(w, "%s (%d): %s\n", what, n, items)
		}
	}
	list("blocks deleted", len(r.BlocksDeleted), joinPrefixes(r.BlocksDeleted))
	list("blocks left without owner", len(r.BlocksUnowned), joinPrefixes(r.BlocksUnowned))
	list("blocks updated", len(r.BlocksUpdated), joinPrefixes(r.BlocksUpdated))
	list("affinities deleted", len(r.AffinitiesDeleted), strings.Join(r.AffinitiesDeleted, " "))
	list("handles deleted", len(r.HandlesDeleted), strings.Join(r.HandlesDeleted, " "))
	list("handles updated", len(r.HandlesUpdated), strings.Join(r.HandlesUpdated, " "))
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "left as it is: %s: %s\n", s.Key, s.Reason)
	}
	state := "complete"
	if !r.Complete() {
		state = "NOT complete"
	}
	fmt.Fprintf(w, "node %s: %s, %d addresses released in %d transactions", r.Node, state, len(r.Released), r.Transactions)
	if r.Record != "" {
		fmt.Fprintf(w, "; record %s", r.Record)
	}
	fmt.Fprintln(w)
}

func joinPrefixes[T fmt.Stringer](ps []T) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, " ")
}
