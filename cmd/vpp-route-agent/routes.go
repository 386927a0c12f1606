package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdconfig"
	"github.com/vpp-route-agent/vpp-route-agent/internal/flagenv"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// routesCmd prints the routes this node must have, read from a live etcd.
func routesCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) (string, bool)) error {
	fs := pflag.NewFlagSet("vpp-route-agent routes", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var ef etcdFlags
	ef.register(fs)
	output := fs.String("output", "table", "output format: table or json")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: vpp-route-agent routes [flags]\n\nPrints the routes node --nodename must have, "+
			"computed from the blocks and peers in etcd, then the routes it cannot resolve.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseWithEnv(fs, args, getenv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments: %s", strings.Join(fs.Args(), " "))}
	}
	if *output != "table" && *output != "json" {
		return usageError{fmt.Errorf("--output: %q is not table or json", *output)}
	}
	e, err := readEtcd(ctx, &ef, getenv)
	if err != nil {
		return err
	}
	defer e.cli.Close()
	node, pools, snap := e.node, e.pools, e.snap
	if snap.Problem != "" {
		fmt.Fprintf(stderr, "warning: %s\n", snap.Problem)
	}
	v := agent.View(snap, agent.Options{NodeName: node, Pools: pools})
	if *output == "json" {
		return writeRoutesJSON(stdout, v, snap)
	}
	for _, r := range v.Desired {
		note := ""
		if r.EncapNote != "" {
			note = " (" + r.EncapNote + ")"
		}
		if b := bfdPeerIPs(snap, r); len(b) > 0 {
			note += " bfd " + strings.Join(b, ",")
		}
		fmt.Fprintf(stdout, "%s via %s%s owner %s encap %s%s\n", r.Prefix, r.NextHop, alsoVia(r), r.Owner, r.Encap, note)
	}
	for _, u := range v.Unresolved {
		fmt.Fprintf(stdout, "unresolved %s owner %s: %s\n", u.Prefix, u.Owner, u.Reason)
	}
	for _, h := range v.Held {
		fmt.Fprintf(stdout, "held %s: value unreadable (%s); the routes in VPP inside it are kept as they are\n", h.Block, h.Reason)
	}
	for _, p := range v.InvalidPeers {
		fmt.Fprintf(stdout, "invalid peer IP %s of node %s: %s\n", p.Addr, p.Node, p.Reason)
	}
	return nil
}

// etcdView is what the routes and explain commands read before they answer: this node's name, the
// managed pools (--pool-cidr; nil: the enabled IP pools), a client (closed by the caller) and one
// complete snapshot.
type etcdView struct {
	node  string
	pools []netip.Prefix
	cli   *clientv3.Client
	snap  *blockwatch.Snapshot
}

// readEtcd checks the etcd flags, resolves this node's name, fails at once, with the reason, when no
// endpoint takes a connection or a certificate is wrong, and lists one complete snapshot.
func readEtcd(ctx context.Context, ef *etcdFlags, getenv func(string) (string, bool)) (*etcdView, error) {
	if err := ef.validate(getenv); err != nil {
		return nil, usageError{err}
	}
	node, err := flagenv.NodeName(ef.nodename, flagenv.NodenameFile)
	if err != nil {
		return nil, usageError{err}
	}
	pools, _ := ef.pools()
	if err := ef.Probe(ctx); errors.Is(err, etcdconfig.ErrCertificate) || etcdconfig.NoneReachable(err, len(ef.Endpoints)) {
		return nil, err
	}
	cli, err := ef.Client()
	if err != nil {
		return nil, err
	}
	snap, err := listOnce(ctx, ef, cli, node)
	if err != nil {
		cli.Close()
		return nil, err
	}
	return &etcdView{node: node, pools: pools, cli: cli, snap: snap}, nil
}

// listOnce takes one complete snapshot, failing within the dial timeout when etcd is unreachable.
func listOnce(ctx context.Context, ef *etcdFlags, cli *clientv3.Client, node string) (*blockwatch.Snapshot, error) {
	limit := ef.DialTimeout + ef.RequestTimeout
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	snap, err := blockwatch.List(ctx, blockwatch.Config{
		Client: cli, BlockPrefix: ef.blockPrefix, HostsPrefix: ef.hostsPrefix,
		RequestTimeout: ef.RequestTimeout, LegacyHostAffinity: ef.legacyHostAffinity,
		Ownership: blockwatch.Ownership(ef.ownership), NodeName: node, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		why := ""
		if perr := ef.Probe(context.Background()); perr != nil {
			why = " (" + perr.Error() + ")"
		}
		return nil, fmt.Errorf("etcd at %s unreachable within %s: %w%s", etcdconfig.Redacted(ef.Endpoints), limit, err, why)
	}
	return snap, nil
}

type routeJSON struct {
	Prefix  string  `json:"prefix"`
	NextHop *string `json:"next_hop"`
	// MoreNextHops are the owner's further peer IPs (one per further uplink): an ECMP path goes to each
	// that one of this node's uplinks reaches.
	MoreNextHops []string `json:"more_next_hops,omitempty"`
	Owner        string   `json:"owner"`
	Kind         string   `json:"kind"`
	Block        string   `json:"block"`
	Encap        string   `json:"encap,omitempty"`
	EncapNote    string   `json:"encap_note,omitempty"`
	Unresolved   string   `json:"unresolved,omitempty"`
	Held         string   `json:"held,omitempty"`
	// BFD are the route's next hops (NextHop, MoreNextHops) on which the owner advertises BFD (--bfd): a
	// node with --bfd opens a session to each on its subnet; their live state is in /debug/routes.
	BFD []string `json:"bfd_peer_ips,omitempty"`
}

// bfdPeerIPs lists the next hops of r on which its owner advertises BFD.
func bfdPeerIPs(snap *blockwatch.Snapshot, r agent.DesiredRoute) []string {
	adv := snap.Peers[r.Owner].BFD.All()
	var out []string
	for _, a := range append([]netip.Addr{r.NextHop}, r.MoreNextHops.All()...) {
		if slices.Contains(adv, a) {
			out = append(out, a.String())
		}
	}
	return out
}

// writeRoutesJSON writes one list: the routes, then the unresolved ones (next_hop null, with the
// reason), then the held blocks (next_hop null, kind "held", with the reason).
func writeRoutesJSON(w io.Writer, v agent.RoutesView, snap *blockwatch.Snapshot) error {
	routes, unresolved := v.Desired, v.Unresolved
	out := make([]routeJSON, 0, len(routes)+len(unresolved)+len(v.Held))
	for _, r := range routes {
		nh := r.NextHop.String()
		rj := routeJSON{Prefix: r.Prefix.String(), NextHop: &nh, Owner: r.Owner, Kind: string(r.Kind), Block: r.Block.String(),
			Encap: r.Encap.String(), EncapNote: r.EncapNote, BFD: bfdPeerIPs(snap, r)}
		for _, a := range r.MoreNextHops.All() {
			rj.MoreNextHops = append(rj.MoreNextHops, a.String())
		}
		out = append(out, rj)
	}
	for _, u := range unresolved {
		out = append(out, routeJSON{Prefix: u.Prefix.String(), Owner: u.Owner, Kind: string(u.Kind), Block: u.Block.String(), Unresolved: u.Reason})
	}
	for _, h := range v.Held {
		out = append(out, routeJSON{Prefix: h.Block.String(), Kind: "held", Block: h.Block.String(), Held: h.Reason})
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// usageError marks errors in flags and arguments (exit status 2).
type usageError struct{ error }

func (u usageError) Unwrap() error { return u.error }

func isUsage(err error) bool {
	var u usageError
	return errors.As(err, &u)
}

// alsoVia names the owner's further peer IPs of a route (" also via 198.51.100.7"), "" when it has one.
func alsoVia(r agent.DesiredRoute) string {
	more := r.MoreNextHops.All()
	if len(more) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString(" also via")
	for _, a := range more {
		b.WriteString(" ")
		b.WriteString(a.String())
	}
	return b.String()
}
