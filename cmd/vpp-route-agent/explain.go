package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdconfig"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// errDisagrees is returned (exit status 3) when this node's VPP does not forward the query the way the
// agent should have programmed it.
var errDisagrees = errors.New("this node's VPP disagrees with the routes computed from etcd")

// explanation is the explain subcommand's answer; its JSON form is the documented schema (docs/agent.md,
// "Why this address?").
type explanation struct {
	Query    string     `json:"query"`
	Address  *string    `json:"address"`
	Node     string     `json:"node"`
	Revision int64      `json:"revision"`
	Warnings []string   `json:"warnings"`
	Pools    []poolInfo `json:"pools"`
	Block    *blockInfo `json:"block"`
	// Allocation is set for an address inside a readable block.
	Allocation *allocationInfo    `json:"allocation"`
	Routes     []agent.RouteGroup `json:"routes"`
	ThisNode   agent.NodeRoutes   `json:"this_node"`
	VPP        *vppInfo           `json:"vpp"`
}

type poolInfo struct {
	Name         string   `json:"name"`
	CIDR         string   `json:"cidr"`
	BlockSize    int      `json:"block_size"`
	Disabled     bool     `json:"disabled"`
	Managed      bool     `json:"managed"`
	IPIPMode     string   `json:"ipip_mode"`
	VXLANMode    string   `json:"vxlan_mode"`
	Encap        string   `json:"encap"`
	CrossSubnet  bool     `json:"cross_subnet"`
	NodeSelector string   `json:"node_selector"`
	Problems     []string `json:"problems"`
	// BlocksClaimed is the number of blocks of the pool in etcd, BlocksPossible how many fit in it:
	// equal means no node can claim another block (new pods borrow, or fail).
	BlocksClaimed  int `json:"blocks_claimed"`
	BlocksPossible int `json:"blocks_possible"`
}

type blockInfo struct {
	CIDR      string  `json:"cidr"`
	Affinity  *string `json:"affinity"`
	Owner     string  `json:"owner"`
	OwnerKind string  `json:"owner_kind"`
	Size      int     `json:"size"`
	Allocated int     `json:"allocated"`
	Free      int     `json:"free"`
	// Held is set when the block's value cannot be read.
	Held *agent.HeldBlock `json:"held"`
}

type allocationInfo struct {
	Ordinal   int     `json:"ordinal"`
	Allocated bool    `json:"allocated"`
	Handle    *string `json:"handle"`
	// HandleAddresses is the number of addresses the handle record says it holds in this block; nil
	// when the record is missing or unreadable (Warnings says which).
	HandleAddresses *int              `json:"handle_addresses"`
	Attributes      map[string]string `json:"attributes"`
	// Borrowed is set when the allocation's node is not the block's owner: other nodes route it as a
	// host route to Node.
	Borrowed bool   `json:"borrowed"`
	Node     string `json:"node"`
	// Releasing is set for an address in Calico's release cool-down (releasedAt set).
	Releasing bool `json:"releasing"`
}

type vppInfo struct {
	Socket  string         `json:"socket"`
	TableID uint32         `json:"table_id"`
	Lookup  *fibLookupJSON `json:"lookup"`
	// Tunnel is, for an encapsulated route of this node, the agent's tunnel to its next hop as VPP has
	// it; nil with TunnelWhy when VPP has none (or the route is flat: both empty).
	Tunnel    *agent.Tunnel `json:"tunnel"`
	TunnelWhy string        `json:"tunnel_why,omitempty"`
	Verdict   agent.Verdict `json:"verdict,omitempty"`
	Detail    string        `json:"detail,omitempty"`
	Error     string        `json:"error,omitempty"`
}

type fibLookupJSON struct {
	Prefix string     `json:"prefix"`
	Paths  []pathJSON `json:"paths"`
}

type pathJSON struct {
	NextHop   *string `json:"next_hop"`
	SwIfIndex *uint32 `json:"sw_if_index"`
	Type      string  `json:"type"`
	// Tunnel is the name of the tunnel interface the path goes through, nil if none.
	Tunnel *string `json:"tunnel"`
}

// explainCmd prints, for one address or prefix, what etcd says about it and the routes every node
// should have for it, and compares this node's VPP with them.
func explainCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) (string, bool)) error {
	fs := pflag.NewFlagSet("vpp-route-agent explain", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	var ef etcdFlags
	ef.register(fs)
	output := fs.String("output", "text", "output format: text or json")
	vppSocket := fs.String("vpp-api-socket", "/run/vpp/api.sock", "this node's VPP binary API socket; empty skips the FIB check")
	vppTimeout := fs.Duration("vpp-reply-timeout", 2*time.Second, "deadline of the VPP connection and lookup")
	tableID := fs.Uint32("table-id", 0, "VPP FIB table the agent programs")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: vpp-route-agent explain [flags] ADDRESS|PREFIX\n\nPrints, from etcd, the pool, block and "+
			"allocation of ADDRESS, the route every node should have for it and why, and what this node's VPP "+
			"forwards it with (ip_route_lookup).\nExit status: 0 explained (and VPP agrees), 1 error, 2 bad usage, "+
			"3 VPP disagrees.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseWithEnv(fs, args, getenv); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return usageError{fmt.Errorf("explain takes one ADDRESS or PREFIX, got %d arguments", fs.NArg())}
	}
	q, isAddr, err := parseQuery(fs.Arg(0))
	if err != nil {
		return usageError{err}
	}
	if *output != "text" && *output != "json" {
		return usageError{fmt.Errorf("--output: %q is not text or json", *output)}
	}
	if *vppTimeout <= 0 {
		return usageError{fmt.Errorf("--vpp-reply-timeout: %s is not positive", *vppTimeout)}
	}
	e, err := readEtcd(ctx, &ef, getenv)
	if err != nil {
		return err
	}
	defer e.cli.Close()
	node, pools, cli, snap := e.node, e.pools, e.cli, e.snap
	if !knownNode(snap, node) {
		return usageError{fmt.Errorf("node %q is not known in etcd: not registered under %s, no Calico Node, owns no block (check --nodename)",
			node, ef.hostsPrefix)}
	}
	x := explain(snap, q, isAddr, node, pools)
	if snap.Problem != "" {
		x.Warnings = append(x.Warnings, snap.Problem)
	}
	if err := readAllocation(ctx, cli, &ef, snap, q, isAddr, &x); err != nil {
		return err
	}

	var vppErr error
	if *vppSocket != "" {
		x.VPP = &vppInfo{Socket: *vppSocket, TableID: *tableID}
		got, tunnels, err := fibLookup(ctx, *vppSocket, *vppTimeout, *tableID, q)
		if err != nil {
			x.VPP.Error = err.Error()
			vppErr = err
		} else {
			x.VPP.Lookup = lookupJSON(got, tunnels)
			if f := x.ThisNode.Forwarding; f != nil && f.Encap != calico.EncapNone {
				if t, ok := tunnels.To(f.Encap, f.NextHop); ok {
					x.VPP.Tunnel = &t
				} else {
					x.VPP.TunnelWhy = fmt.Sprintf("VPP has no %s tunnel of the agent (tag %q) to %s", f.Encap, agent.TunnelTag, f.NextHop)
				}
			}
			x.VPP.Verdict, x.VPP.Detail = agent.CheckFIB(x.ThisNode, q, got, agent.ManagedPools(snap, pools), tunnels)
		}
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(x); err != nil {
			return err
		}
	} else {
		writeExplanation(stdout, x)
	}
	switch {
	case vppErr != nil:
		return vppErr
	case x.VPP != nil && x.VPP.Verdict == agent.VerdictDisagrees:
		return errDisagrees
	}
	return nil
}

// parseQuery reads ADDRESS or PREFIX: canonical (IPv4-mapped addresses unmapped), no zone, no host bits.
func parseQuery(s string) (netip.Prefix, bool, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		if a.Zone() != "" {
			return netip.Prefix{}, false, fmt.Errorf("%q: an address with a zone is not a pod address", s)
		}
		return calico.HostPrefix(a), true, nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, false, fmt.Errorf("%q is neither an IP address nor a prefix (CIDR)", s)
	}
	if p != p.Masked() {
		return netip.Prefix{}, false, fmt.Errorf("%s has host bits set: give the address %s or the prefix %s", p, p.Addr(), p.Masked())
	}
	p = netaddr.Canonical(p)
	return p, p.IsSingleIP(), nil
}

// knownNode reports whether etcd knows node: registered, with a Calico Node, or owning a block.
func knownNode(snap *blockwatch.Snapshot, node string) bool {
	if _, ok := snap.Peers[node]; ok {
		return true
	}
	if _, ok := snap.Nodes[node]; ok {
		return true
	}
	for _, b := range snap.Blocks.All() {
		if b.Owner.IsNode() && b.Owner.Node == node {
			return true
		}
	}
	return false
}

// explain fills in everything the snapshot tells about q.
func explain(snap *blockwatch.Snapshot, q netip.Prefix, isAddr bool, node string, explicit []netip.Prefix) explanation {
	x := explanation{Query: q.String(), Node: node, Revision: snap.Revision, Warnings: []string{}, Pools: []poolInfo{}}
	if isAddr {
		a := q.Addr().String()
		x.Address = &a
	}
	managed := agent.ManagedPools(snap, explicit)
	for _, name := range slices.Sorted(maps.Keys(snap.Pools)) {
		p := snap.Pools[name]
		if !p.CIDR.Overlaps(q) {
			continue
		}
		e := p.Encap()
		pi := poolInfo{Name: p.Name, CIDR: p.CIDR.String(), BlockSize: p.BlockSize, Disabled: p.Disabled,
			Managed:  slices.ContainsFunc(managed, func(m netip.Prefix) bool { return netaddr.Covers(m, p.CIDR) }),
			IPIPMode: string(p.IPIPMode), VXLANMode: string(p.VXLANMode), Encap: e.Type.String(), CrossSubnet: e.CrossSubnet,
			NodeSelector: p.NodeSelector, Problems: []string{}}
		for _, pr := range p.EncapProblems() {
			pi.Problems = append(pi.Problems, pr.Error())
		}
		if p.BlockSize >= p.CIDR.Bits() && p.BlockSize-p.CIDR.Bits() < 31 {
			pi.BlocksPossible = 1 << (p.BlockSize - p.CIDR.Bits())
		}
		for cidr := range snap.Blocks.All() {
			if netaddr.Covers(p.CIDR, cidr) {
				pi.BlocksClaimed++
			}
		}
		for cidr := range snap.Held {
			if netaddr.Covers(p.CIDR, cidr) && snap.Blocks.Get(cidr) == nil {
				pi.BlocksClaimed++ // a block whose value cannot be read still takes its place
			}
		}
		x.Pools = append(x.Pools, pi)
	}
	re := agent.ExplainRoutes(snap, q, agent.Options{NodeName: node, Pools: explicit})
	x.Routes, x.ThisNode = re.Groups, re.This
	return x
}

// readAllocation reads the block that contains q, and for an address its allocation and handle, at the
// snapshot's revision (so that they match the routes), or at the current one if that was compacted.
func readAllocation(ctx context.Context, cli *clientv3.Client, ef *etcdFlags, snap *blockwatch.Snapshot, q netip.Prefix, isAddr bool, x *explanation) error {
	var cidr netip.Prefix
	var routing *blockwatch.Block
	for c, b := range snap.Blocks.All() {
		if netaddr.Covers(c, q) && (!cidr.IsValid() || c.Bits() > cidr.Bits()) {
			cidr, routing = c, b
		}
	}
	var held *agent.HeldBlock
	for c, h := range snap.Held {
		if netaddr.Covers(c, q) {
			held = &agent.HeldBlock{Block: c, Reason: h.Reason, Revision: h.Revision, LastGood: h.LastGood}
			cidr = c
		}
	}
	if !cidr.IsValid() {
		return nil
	}
	x.Block = &blockInfo{CIDR: cidr.String(), Size: calico.Size(cidr), Held: held, OwnerKind: calico.OwnerNone.String()}
	if routing != nil {
		x.Block.Owner, x.Block.OwnerKind = routing.Owner.Node, routing.Owner.Kind.String()
	}
	if held != nil {
		return nil
	}
	get := func(key string) (*clientv3.GetResponse, error) {
		rctx, cancel := context.WithTimeout(ctx, ef.RequestTimeout)
		defer cancel()
		resp, err := cli.Get(rctx, key, clientv3.WithRev(snap.Revision))
		if errors.Is(err, rpctypes.ErrCompacted) {
			x.Warnings = append(x.Warnings, fmt.Sprintf("revision %d compacted: %s read at the current revision", snap.Revision, key))
			rctx2, cancel2 := context.WithTimeout(ctx, ef.RequestTimeout)
			defer cancel2()
			resp, err = cli.Get(rctx2, key)
		}
		if err != nil {
			return nil, fmt.Errorf("read %s from etcd at %s: %w", key, etcdconfig.Redacted(ef.Endpoints), err)
		}
		return resp, nil
	}
	key := ef.blockPrefix + netaddr.PrefixFamily(cidr).String() + "/block/" + calico.EncodeCIDR(cidr)
	resp, err := get(key)
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 {
		x.Warnings = append(x.Warnings, fmt.Sprintf("block %s vanished from etcd", cidr))
		return nil
	}
	b, err := calico.DecodeBlock(resp.Kvs[0].Value)
	if err != nil {
		x.Warnings = append(x.Warnings, fmt.Sprintf("block %s: %v", cidr, err))
		return nil
	}
	x.Block.Affinity = b.Affinity
	x.Block.Allocated = b.Allocated()
	x.Block.Free = x.Block.Size - x.Block.Allocated
	if !isAddr {
		return nil
	}
	ord, ok := calico.Ordinal(cidr, q.Addr())
	if !ok {
		return nil
	}
	a := &allocationInfo{Ordinal: ord, Attributes: map[string]string{}}
	x.Allocation = a
	attr := b.AttributeOf(ord)
	if attr == nil {
		return nil
	}
	a.Allocated = true
	a.Releasing = len(attr.ReleasedAt) > 0 && string(attr.ReleasedAt) != "null"
	maps.Copy(a.Attributes, attr.Secondary)
	a.Node = attr.Secondary[calico.AttrNode]
	if routing != nil {
		a.Borrowed = a.Node != "" && !(routing.Owner.IsNode() && routing.Owner.Node == a.Node)
	}
	if h := attr.Handle(); h != "" {
		a.Handle = &h
		hresp, err := get(calico.HandleKey(calico.SanitizeHandle(h)))
		if err != nil {
			return err
		}
		switch {
		case len(hresp.Kvs) == 0:
			x.Warnings = append(x.Warnings, fmt.Sprintf("handle %s has no record under %s (leaked allocation?)", h, calico.HandlePrefix))
		default:
			hv, err := calico.DecodeHandle(hresp.Kvs[0].Value)
			if err != nil {
				x.Warnings = append(x.Warnings, fmt.Sprintf("handle %s: %v", h, err))
				break
			}
			n := hv.Block[cidr.String()]
			a.HandleAddresses = &n
			if n == 0 {
				x.Warnings = append(x.Warnings, fmt.Sprintf("handle %s's record holds no address in block %s", h, cidr))
			}
		}
	}
	return nil
}

func lookupJSON(e vppapi.FIBEntry, tunnels agent.Tunnels) *fibLookupJSON {
	out := &fibLookupJSON{Prefix: e.Prefix.String(), Paths: []pathJSON{}}
	for _, p := range e.Paths {
		pj := pathJSON{Type: p.Type.String()}
		if p.NextHop.IsValid() {
			nh := p.NextHop.String()
			pj.NextHop = &nh
		}
		if p.SwIfIndex != ^uint32(0) {
			idx := p.SwIfIndex
			pj.SwIfIndex = &idx
		}
		if t, ok := tunnels[p.SwIfIndex]; ok {
			pj.Tunnel = &t.Name
		}
		out.Paths = append(out.Paths, pj)
	}
	return out
}

// writeExplanation prints x under the headings Address (or Prefix), Pool, Block, Allocation, Routes and
// This node's VPP.
func writeExplanation(w io.Writer, x explanation) {
	if x.Address != nil {
		fmt.Fprintf(w, "Address %s\n", *x.Address)
	} else {
		fmt.Fprintf(w, "Prefix %s\n", x.Query)
	}
	fmt.Fprintf(w, "  etcd revision %d, this node %s\n", x.Revision, x.Node)
	for _, warn := range x.Warnings {
		fmt.Fprintf(w, "  warning: %s\n", warn)
	}

	fmt.Fprintf(w, "\nPool\n")
	if len(x.Pools) == 0 {
		fmt.Fprintf(w, "  none: outside every IP pool in etcd\n")
	}
	for _, p := range x.Pools {
		state := "enabled"
		if p.Disabled {
			state = "disabled"
		}
		managed := "managed by the agents"
		if !p.Managed {
			managed = "NOT managed (no routes)"
		}
		fmt.Fprintf(w, "  %s %s: block size /%d, %s, %s\n", p.Name, p.CIDR, p.BlockSize, state, managed)
		cross := ""
		if p.CrossSubnet {
			cross = ", cross-subnet only"
		}
		fmt.Fprintf(w, "  ipipMode %s, vxlanMode %s: encapsulation %s%s\n", p.IPIPMode, p.VXLANMode, p.Encap, cross)
		full := ""
		if p.BlocksPossible > 0 && p.BlocksClaimed >= p.BlocksPossible {
			full = ": EXHAUSTED, no node can claim another block"
		}
		fmt.Fprintf(w, "  blocks claimed %d of %d%s\n", p.BlocksClaimed, p.BlocksPossible, full)
		if p.NodeSelector != "" && p.NodeSelector != "all()" {
			fmt.Fprintf(w, "  node selector %s\n", p.NodeSelector)
		}
		for _, pr := range p.Problems {
			fmt.Fprintf(w, "  problem: %s\n", pr)
		}
	}

	fmt.Fprintf(w, "\nBlock\n")
	switch b := x.Block; {
	case b == nil:
		fmt.Fprintf(w, "  none: no block in etcd contains it\n")
	case b.Held != nil:
		fmt.Fprintf(w, "  %s HELD: its value cannot be read (%s), mod revision %d; the routes inside it stay as they are\n",
			b.CIDR, b.Held.Reason, b.Held.Revision)
	default:
		owner := "no node (" + b.OwnerKind + ")"
		if b.OwnerKind == calico.OwnerHost.String() || b.OwnerKind == calico.OwnerLegacyHost.String() {
			owner = "node " + b.Owner
		} else if b.OwnerKind == calico.OwnerVirtual.String() {
			owner = "virtual owner " + b.Owner
		}
		aff := "null"
		if b.Affinity != nil {
			aff = fmt.Sprintf("%q", *b.Affinity)
		}
		fmt.Fprintf(w, "  %s: owner %s (affinity %s)\n", b.CIDR, owner, aff)
		fmt.Fprintf(w, "  %d of %d addresses allocated, %d free\n", b.Allocated, b.Size, b.Free)
	}

	if x.Address != nil {
		fmt.Fprintf(w, "\nAllocation\n")
		switch a := x.Allocation; {
		case a == nil:
			fmt.Fprintf(w, "  none known (no readable block contains it)\n")
		case !a.Allocated:
			fmt.Fprintf(w, "  ordinal %d: free, not allocated\n", a.Ordinal)
		default:
			h := "none"
			if a.Handle != nil {
				h = *a.Handle
			}
			fmt.Fprintf(w, "  ordinal %d: allocated, handle %s", a.Ordinal, h)
			if a.HandleAddresses != nil {
				fmt.Fprintf(w, " (its record holds %d address(es) in this block)", *a.HandleAddresses)
			}
			fmt.Fprintln(w)
			for _, k := range slices.Sorted(maps.Keys(a.Attributes)) {
				fmt.Fprintf(w, "  %s: %s\n", k, a.Attributes[k])
			}
			switch {
			case a.Borrowed:
				fmt.Fprintf(w, "  BORROWED by node %s from the block of %s: routed as a host route to %s\n", a.Node, ownerName(x.Block), a.Node)
			case a.Node != "":
				fmt.Fprintf(w, "  on the block's owner %s: not borrowed\n", a.Node)
			}
			if a.Releasing {
				fmt.Fprintf(w, "  in release cool-down (releasedAt set)\n")
			}
		}
	}

	fmt.Fprintf(w, "\nRoutes (every node: what it should have and why)\n")
	for _, g := range x.Routes {
		this := ""
		if slices.Contains(g.Nodes, x.Node) {
			this = " (this node among them)"
			if len(g.Nodes) == 1 {
				this = " (this node)"
			}
		}
		fmt.Fprintf(w, "  %s%s:\n", nodeList(g.Nodes), this)
		switch {
		case g.Forwarding != nil:
			fmt.Fprintf(w, "    %s\n", routeLine(*g.Forwarding))
			fmt.Fprintf(w, "      because %s\n", g.Forwarding.EncapWhy)
		default:
			fmt.Fprintf(w, "    no route: %s\n", g.Why)
		}
		for _, r := range g.Routes {
			if g.Forwarding == nil || r != *g.Forwarding {
				fmt.Fprintf(w, "    also %s\n", routeLine(r))
			}
		}
		for _, u := range g.Unresolved {
			fmt.Fprintf(w, "    unresolved %s (%s of %s): %s\n", u.Prefix, u.Kind, u.Owner, u.Reason)
		}
	}

	fmt.Fprintf(w, "\nThis node's VPP\n")
	switch v := x.VPP; {
	case v == nil:
		fmt.Fprintf(w, "  not checked (--vpp-api-socket empty)\n")
	case v.Error != "":
		fmt.Fprintf(w, "  lookup failed: %s\n", v.Error)
	default:
		paths := make([]string, len(v.Lookup.Paths))
		for i, p := range v.Lookup.Paths {
			paths[i] = p.Type
			if p.NextHop != nil {
				paths[i] = "via " + *p.NextHop
			}
			switch {
			case p.Tunnel != nil && p.NextHop != nil:
				paths[i] = fmt.Sprintf("through %s (sw_if_index %d) via %s", *p.Tunnel, *p.SwIfIndex, *p.NextHop)
			case p.Tunnel != nil:
				paths[i] = fmt.Sprintf("through %s (sw_if_index %d)", *p.Tunnel, *p.SwIfIndex)
			case p.SwIfIndex != nil:
				paths[i] += fmt.Sprintf(" sw_if_index %d", *p.SwIfIndex)
			}
		}
		fmt.Fprintf(w, "  table %d, ip_route_lookup %s: %s %s\n", v.TableID, x.Query, v.Lookup.Prefix, strings.Join(paths, ", "))
		switch t := v.Tunnel; {
		case t != nil:
			fmt.Fprintf(w, "  tunnel %s (sw_if_index %d): %s %s -> %s, the agent's\n", t.Name, t.SwIfIndex, t.Encap, t.Source, t.Peer)
		case v.TunnelWhy != "":
			fmt.Fprintf(w, "  tunnel: %s\n", v.TunnelWhy)
		}
		fmt.Fprintf(w, "  %s: %s\n", strings.ToUpper(string(v.Verdict)), v.Detail)
	}
}

func routeLine(r agent.ExplainedRoute) string {
	if r.Kind == agent.KindBorrowed {
		return fmt.Sprintf("%s via %s%s: address borrowed by %s from block %s, encap %s", r.Prefix, r.NextHop, alsoVia(r.DesiredRoute), r.Owner, r.Block, r.Encap)
	}
	return fmt.Sprintf("%s via %s%s: block of %s, encap %s", r.Prefix, r.NextHop, alsoVia(r.DesiredRoute), r.Owner, r.Encap)
}

func nodeList(nodes []string) string {
	const show = 8
	if len(nodes) <= show {
		return strings.Join(nodes, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(nodes[:show], ", "), len(nodes)-show)
}

func ownerName(b *blockInfo) string {
	if b == nil || b.Owner == "" {
		return "no node"
	}
	return b.Owner
}
