// Package vpptopo starts small multi-node data planes of real VPP processes for tests: node VPPs whose
// uplinks are memif interfaces, wired to a fabric VPP that bridges them (one L2 segment), to a router
// VPP that routes between two node subnets and knows nothing of pod blocks, or to two fabric VPPs (each
// node dual-homed, one uplink into each). Each node has one "pod" (or Config.Pods of them): an IPv4 /32
// and an IPv6 /128 of the node's blocks on a loopback interface, as the CNI on the node would leave it. Pings between pods (VPP's ping, sourced from the pod's interface) then show whether the routes
// a route agent programmed carry packets.
//
// It needs a VPP with the memif and ping plugins (fd.io's vpp-plugin-core package has both), its
// installation directory named by VPP_LAB_PKG: /usr for fd.io's packages, or an unpacked package. Memif needs no root and no hugepages, and every interface is in
// interrupt mode, so idle VPPs use no CPU.
package vpptopo

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.fd.io/govpp/api"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
)

// EnvLabPackage names the environment variable with the unpacked lab build's directory (separate from
// vppproc's VPP_PKG, which may be the minimal build without plugins).
const EnvLabPackage = "VPP_LAB_PKG"

// HowToGet tells a user without a lab build how to get one.
const HowToGet = "no VPP lab build: set " + EnvLabPackage + " to a VPP installation with the memif and ping plugins\n" +
	"  (bin/vpp, lib/*/vpp_plugins): " + EnvLabPackage + "=/usr with fd.io's vpp and vpp-plugin-core packages installed,\n" +
	"  or an unpacked package directory such as /opt/vpp-v26.06-lab"

// ErrNoLab is returned by FindLab when VPP_LAB_PKG is not set.
var ErrNoLab = errors.New(HowToGet)

// plugins are the plugins every VPP of a topology loads.
var plugins = []string{"memif_plugin.so", "ping_plugin.so"}

// FindLab returns the binaries of the lab build named by VPP_LAB_PKG, checking that it has the plugins.
func FindLab() (vppproc.Binaries, error) {
	dir := os.Getenv(EnvLabPackage)
	if dir == "" {
		return vppproc.Binaries{}, ErrNoLab
	}
	bin, err := vppproc.FromPackage(dir)
	if err != nil {
		return vppproc.Binaries{}, fmt.Errorf("%s: %w", EnvLabPackage, err)
	}
	if err := HasLabPlugins(bin); err != nil {
		return vppproc.Binaries{}, fmt.Errorf("%s=%s: %w", EnvLabPackage, dir, err)
	}
	return bin, nil
}

// HasLabPlugins returns nil if bin has the plugins a topology needs (memif, ping), else an error naming
// the first one missing.
func HasLabPlugins(bin vppproc.Binaries) error {
	pluginDir, err := bin.PluginDir()
	if err != nil {
		return err
	}
	for _, p := range plugins {
		if _, err := os.Stat(filepath.Join(pluginDir, p)); err != nil {
			return fmt.Errorf("not a lab build (no %s): %w", p, err)
		}
	}
	return nil
}

// Kind is how the nodes are connected.
type Kind int

const (
	// Fabric puts every node on one L2 segment, 192.168.50.0/24 and fd00:50::/64: a fabric VPP bridges
	// its memif ports in one bridge domain.
	Fabric Kind = iota
	// Routed puts odd nodes in 192.168.51.0/24 (fd00:51::/64) and even ones in 192.168.52.0/24
	// (fd00:52::/64); a router VPP holds .254 (::fe) in each, bridging each subnet's ports behind a BVI
	// loopback, and routes between them. Nodes have default routes via it. It has no route to a pod block.
	Routed
	// DualHomed gives every node two uplinks, as a node with two NICs to two top-of-rack switches:
	// memif1/0 into fabric A (192.168.61.0/24, fd00:61::/64) and memif2/0 into fabric B
	// (192.168.62.0/24, fd00:62::/64), each fabric a VPP bridging its ports in one bridge domain. Each
	// node has two peer IPs of each family, one per fabric.
	DualHomed
)

func (k Kind) String() string {
	switch k {
	case Routed:
		return "routed"
	case DualHomed:
		return "dual-homed"
	}
	return "fabric"
}

// MaxNodes is the largest number of nodes a topology can have (addresses and MACs have one digit).
const MaxNodes = 9

// Config describes a topology.
type Config struct {
	Kind Kind
	// Nodes is the number of node VPPs, 2 to MaxNodes.
	Nodes int
	// Dir holds the run directories and memif sockets; it must be short (unix socket paths are limited to
	// 107 bytes).
	Dir string
	// HeapMB is each VPP's main heap; 0 means 128 (the smallest that starts; plenty for a few routes).
	HeapMB int
	// VXLAN loads the vxlan plugin (VXLANPlugin) into the node VPPs as well.
	VXLAN bool
	// NoPods leaves PodInterface without addresses: the caller places its own pods there (the lab puts
	// the addresses block-ipam gave). Block4, Block6, Pod4 and Pod6 are then meaningless.
	NoPods bool
	// Pods is the number of pods on each node, ordinals 1 to Pods of its blocks, 1 to MaxPods; 0 means
	// 1. Several pods make several flows between two nodes, which ECMP hashes over its paths.
	Pods int
}

// MaxPods is the largest Config.Pods (a /26 block has 64 addresses).
const MaxPods = 62

// VXLANPlugin is the file of VPP's vxlan plugin, which the lab build has.
const VXLANPlugin = "vxlan_plugin.so"

// PodInterface is the loopback that holds a node's pod addresses.
const PodInterface = "loop1"

// UplinkInterface is every node's uplink: its memif slave towards the fabric or router (DualHomed:
// towards fabric A).
const UplinkInterface = "memif1/0"

// SecondUplinkInterface is a DualHomed node's uplink towards fabric B.
const SecondUplinkInterface = "memif2/0"

// Uplink is one uplink of a node.
type Uplink struct {
	// Interface is the node's memif interface (UplinkInterface, SecondUplinkInterface).
	Interface string
	// Addr4 and Addr6 are its addresses, with the subnet's length: the node's peer IPs on it.
	Addr4, Addr6 netip.Prefix
}

// Addr returns the uplink's IPv6 address if ipv6, else its IPv4 address.
func (u Uplink) Addr(ipv6 bool) netip.Addr {
	if ipv6 {
		return u.Addr6.Addr()
	}
	return u.Addr4.Addr()
}

// Flag returns the uplink's addresses as the agent's --uplink-address takes one uplink's ("+" joins
// the families).
func (u Uplink) Flag() string { return u.Addr4.String() + "+" + u.Addr6.String() }

// Node is one node of a topology.
type Node struct {
	Name string // node-1, node-2, ...
	VPP  *vppproc.VPP
	// Addr4 and Addr6 are the (first) uplink's addresses, with the subnet's length: the node's peer IPs.
	Addr4, Addr6 netip.Prefix
	// Uplinks are the node's uplinks in order: one (Fabric, Routed; Addr4 and Addr6 are its addresses)
	// or two (DualHomed: fabric A's, then fabric B's). Uplink k is port memif<i>/0 of switch k
	// (Topology.Switches) for node-<i>.
	Uplinks []Uplink
	// Gateway4 and Gateway6 are the router's addresses in the node's subnet (Routed only).
	Gateway4, Gateway6 netip.Addr
	// Block4 and Block6 are the node's pod blocks: 10.244.<i>.0/26 and fd00:244:0:<i>::/122.
	Block4, Block6 netip.Prefix
	// Pod4 and Pod6 are the pod's addresses, the first host of each block (ordinal 1), on PodInterface.
	Pod4, Pod6 netip.Addr
	// Pods4 and Pods6 are every pod's addresses, ordinals 1 to Config.Pods (Pods4[0] is Pod4), on
	// PodInterface.
	Pods4, Pods6 []netip.Addr

	index int // i of node-<i>: its port on each switch is memif<i>/0
}

// Pod returns the pod's IPv6 address if ipv6, else its IPv4 address.
func (n *Node) Pod(ipv6 bool) netip.Addr {
	if ipv6 {
		return n.Pod6
	}
	return n.Pod4
}

// Topology is a running set of VPPs.
type Topology struct {
	Kind  Kind
	Nodes []*Node
	// Switch is the fabric or router VPP (DualHomed: fabric A).
	Switch *vppproc.VPP
	// Switches are every switch VPP: Switch alone, or DualHomed's fabrics A and B. Node uplink k is
	// wired to Switches[k].
	Switches []*vppproc.VPP
}

// Start starts the VPPs of cfg and returns once every node's uplinks are linked to their switches. On
// error it stops whatever it started.
func Start(ctx context.Context, bin vppproc.Binaries, cfg Config) (*Topology, error) {
	if cfg.Nodes < 2 || cfg.Nodes > MaxNodes {
		return nil, fmt.Errorf("topology of %d nodes: want 2 to %d", cfg.Nodes, MaxNodes)
	}
	if cfg.Pods == 0 {
		cfg.Pods = 1
	}
	if cfg.Pods < 1 || cfg.Pods > MaxPods {
		return nil, fmt.Errorf("%d pods per node: want 1 to %d", cfg.Pods, MaxPods)
	}
	if cfg.HeapMB == 0 {
		cfg.HeapMB = 128
	}
	t := &Topology{Kind: cfg.Kind}
	nodePlugins := plugins
	if cfg.VXLAN {
		nodePlugins = append(slices.Clone(plugins), VXLANPlugin)
	}
	switchSetup := make([][]string, switches(cfg.Kind))
	for i := 1; i <= cfg.Nodes; i++ {
		n := newNode(cfg.Kind, i, cfg.Pods)
		var setup []string
		for k, u := range n.Uplinks {
			// The memif link of node i to switch k; the switch is the memif master of every link (socket
			// id i, interface memif<i>/0), the node the slave (socket id k+1, so interface memif<k+1>/0).
			// MACs are fixed: memif picks them from a clock-seeded random number otherwise.
			sock := filepath.Join(cfg.Dir, fmt.Sprintf("%s%d.sock", socketPrefix(cfg.Kind, k), i))
			if len(sock) > 107 {
				return nil, fmt.Errorf("directory %s is too long for a unix socket path", cfg.Dir)
			}
			bd := 1 // the bridge domain of the node's segment on the switch
			if cfg.Kind == Routed {
				bd = subnet(i)
			}
			switchSetup[k] = append(switchSetup[k],
				fmt.Sprintf("create memif socket id %d filename %s", i, sock),
				fmt.Sprintf("create interface memif socket-id %d id 0 master hw-addr 02:fe:00:0%d:01:0%d", i, k, i),
				fmt.Sprintf("set interface state memif%d/0 up", i),
				fmt.Sprintf("set interface l2 bridge memif%d/0 %d", i, bd))
			setup = append(setup,
				fmt.Sprintf("create memif socket id %d filename %s", k+1, sock),
				fmt.Sprintf("create interface memif socket-id %d id 0 slave hw-addr 02:fe:00:0%d:00:0%d", k+1, k, i),
				"set interface state "+u.Interface+" up",
				"set interface ip address "+u.Interface+" "+u.Addr4.String(),
				"set interface ip address "+u.Interface+" "+u.Addr6.String())
		}
		setup = append(setup,
			"create loopback interface instance 1",
			"set interface state "+PodInterface+" up")
		if !cfg.NoPods {
			for j := range n.Pods4 {
				setup = append(setup,
					"set interface ip address "+PodInterface+" "+netip.PrefixFrom(n.Pods4[j], 32).String(),
					"set interface ip address "+PodInterface+" "+netip.PrefixFrom(n.Pods6[j], 128).String())
			}
		}
		if cfg.Kind == Routed {
			setup = append(setup,
				"ip route add 0.0.0.0/0 via "+n.Gateway4.String()+" "+UplinkInterface,
				"ip route add ::/0 via "+n.Gateway6.String()+" "+UplinkInterface)
		}
		p, err := vppproc.Start(ctx, bin, vppproc.Options{Dir: filepath.Join(cfg.Dir, n.Name), Setup: setup,
			Plugins: nodePlugins, InterruptMode: true, HeapMB: cfg.HeapMB})
		if err != nil {
			t.Stop()
			return nil, fmt.Errorf("start %s's VPP: %w", n.Name, err)
		}
		n.VPP = p
		t.Nodes = append(t.Nodes, n)
	}
	if cfg.Kind == Routed {
		// Each subnet is a bridge domain whose BVI loopback (loop<bd>) holds the router's address.
		for bd := 1; bd <= 2; bd++ {
			gw4, gw6 := gateways(bd)
			loop := fmt.Sprintf("loop%d", bd)
			switchSetup[0] = append(switchSetup[0],
				fmt.Sprintf("create loopback interface instance %d", bd),
				fmt.Sprintf("set interface l2 bridge %s %d bvi", loop, bd),
				"set interface state "+loop+" up",
				"set interface ip address "+loop+" "+gw4.String(),
				"set interface ip address "+loop+" "+gw6.String())
		}
	}
	for k, setup := range switchSetup {
		sw, err := vppproc.Start(ctx, bin, vppproc.Options{Dir: filepath.Join(cfg.Dir, switchName(cfg.Kind, k)), Setup: setup,
			Plugins: plugins, InterruptMode: true, HeapMB: cfg.HeapMB})
		if err != nil {
			t.Stop()
			return nil, fmt.Errorf("start the %s VPP: %w", switchName(cfg.Kind, k), err)
		}
		t.Switches = append(t.Switches, sw)
	}
	t.Switch = t.Switches[0]
	for _, n := range t.Nodes {
		if err := n.waitLinked(ctx); err != nil {
			t.Stop()
			return nil, err
		}
	}
	return t, nil
}

// switches is the number of switch VPPs of a topology of kind.
func switches(kind Kind) int {
	if kind == DualHomed {
		return 2
	}
	return 1
}

// switchName names switch k: its run directory, in messages.
func switchName(kind Kind, k int) string {
	if kind == DualHomed {
		return "fabric-" + string(rune('a'+k))
	}
	return kind.String()
}

// socketPrefix begins the memif socket file names of switch k's links.
func socketPrefix(kind Kind, k int) string {
	if kind == DualHomed {
		return string(rune('a' + k))
	}
	return "n"
}

// subnet is the subnet (1 or 2) of node i in a routed topology.
func subnet(i int) int { return 2 - i%2 }

// gateways are the router's addresses in subnet s.
func gateways(s int) (netip.Prefix, netip.Prefix) {
	return netip.MustParsePrefix(fmt.Sprintf("192.168.%d.254/24", 50+s)), netip.MustParsePrefix(fmt.Sprintf("fd00:%d::fe/64", 50+s))
}

func newNode(kind Kind, i, pods int) *Node {
	n := &Node{Name: fmt.Sprintf("node-%d", i), index: i,
		Block4: netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/26", i)),
		Block6: netip.MustParsePrefix(fmt.Sprintf("fd00:244:0:%d::/122", i)),
	}
	p4, p6 := n.Block4.Addr(), n.Block6.Addr()
	for range pods {
		p4, p6 = p4.Next(), p6.Next()
		n.Pods4, n.Pods6 = append(n.Pods4, p4), append(n.Pods6, p6)
	}
	n.Pod4, n.Pod6 = n.Pods4[0], n.Pods6[0]
	nets := []int{50}
	switch kind {
	case Routed:
		nets[0] += subnet(i)
		gw4, gw6 := gateways(subnet(i))
		n.Gateway4, n.Gateway6 = gw4.Addr(), gw6.Addr()
	case DualHomed:
		nets = []int{61, 62}
	}
	for k, net := range nets {
		n.Uplinks = append(n.Uplinks, Uplink{Interface: fmt.Sprintf("memif%d/0", k+1),
			Addr4: netip.MustParsePrefix(fmt.Sprintf("192.168.%d.%d/24", net, i)),
			Addr6: netip.MustParsePrefix(fmt.Sprintf("fd00:%d::%d/64", net, i))})
	}
	n.Addr4, n.Addr6 = n.Uplinks[0].Addr4, n.Uplinks[0].Addr6
	return n
}

// Stop stops every VPP of the topology, in parallel (each takes about 2 s).
func (t *Topology) Stop() {
	var wg sync.WaitGroup
	for _, n := range t.Nodes {
		if n.VPP != nil {
			wg.Go(n.VPP.Stop)
		}
	}
	for _, sw := range t.Switches {
		wg.Go(sw.Stop)
	}
	wg.Wait()
}

// waitLinkUp polls until interface name exists and its link is up (the memif peer connected).
func waitLinkUp(ctx context.Context, v *vppproc.VPP, name string, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		up, err := linkUp(ctx, v, name)
		if err == nil && up {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("interface %s not linked within %s (last error: %v); see %s/vpp.log", name, within, err, v.Dir())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func linkUp(ctx context.Context, v *vppproc.VPP, name string) (bool, error) {
	d, err := findInterface(ctx, v, name)
	if err != nil || d == nil {
		return false, err
	}
	return d.Flags&interface_types.IF_STATUS_API_FLAG_LINK_UP != 0, nil
}

// InterfaceIndex returns the sw_if_index of node n's interface name.
func (n *Node) InterfaceIndex(ctx context.Context, name string) (uint32, error) {
	d, err := findInterface(ctx, n.VPP, name)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%s: %w", n.Name, err)
	case d == nil:
		return 0, fmt.Errorf("%s has no interface %s", n.Name, name)
	}
	return uint32(d.SwIfIndex), nil
}

// findInterface returns the details of v's interface name, nil if there is none.
func findInterface(ctx context.Context, v *vppproc.VPP, name string) (*interfaces.SwInterfaceDetails, error) {
	var found *interfaces.SwInterfaceDetails
	err := v.Call(ctx, func(ch api.Channel) error {
		req := ch.SendMultiRequest(&interfaces.SwInterfaceDump{SwIfIndex: ^interface_types.InterfaceIndex(0)})
		for {
			d := new(interfaces.SwInterfaceDetails)
			last, err := req.ReceiveReply(d)
			if err != nil || last {
				return err
			}
			if d.InterfaceName == name {
				found = d
			}
		}
	})
	return found, err
}

// PingResult is what one run of VPP's ping reported.
type PingResult struct {
	Sent, Received int
}

func (r PingResult) String() string { return fmt.Sprintf("%d/%d", r.Received, r.Sent) }

var pingStats = regexp.MustCompile(`Statistics: (\d+) sent, (\d+) received`)

// ParsePing reads the statistics line of VPP's ping output.
func ParsePing(out string) (PingResult, error) {
	m := pingStats.FindStringSubmatch(out)
	if m == nil {
		return PingResult{}, fmt.Errorf("no ping statistics in %q", out)
	}
	sent, _ := strconv.Atoi(m[1])
	received, _ := strconv.Atoi(m[2])
	return PingResult{Sent: sent, Received: received}, nil
}

// Ping runs VPP's ping on v: count echoes to dst, 0.1 s apart, from the address of interface source
// (of dst's family).
func Ping(ctx context.Context, v *vppproc.VPP, source string, dst netip.Addr, count int) (PingResult, error) {
	return PingSize(ctx, v, source, dst, count, 0)
}

// PingOverhead is what VPP's ping adds to its size argument to make the IP packet: the IP header (20 for
// IPv4, 40 for IPv6), ICMP's 8 bytes and the 8-byte timestamp VPP puts before its data (measured: size
// 8964 is the largest IPv4 echo a 9000-byte link carries unfragmented).
func PingOverhead(ipv6 bool) int {
	if ipv6 {
		return 40 + 16
	}
	return 20 + 16
}

// PingSize is Ping with echoes of size bytes of data (VPP's `size`; the IP packet is PingOverhead
// larger); 0 means VPP's default. VPP's ping cannot set IPv4's DF bit: an echo larger than the path's
// MTU is fragmented by the sender.
func PingSize(ctx context.Context, v *vppproc.VPP, source string, dst netip.Addr, count, size int) (PingResult, error) {
	cmd := fmt.Sprintf("ping %s source %s repeat %d interval 0.1", dst, source, count)
	if size > 0 {
		cmd += fmt.Sprintf(" size %d", size)
	}
	out, err := v.CLI(ctx, cmd)
	if err != nil {
		return PingResult{}, err
	}
	r, err := ParsePing(out)
	if err != nil {
		return PingResult{}, fmt.Errorf("%s: %w", cmd, err)
	}
	return r, nil
}

// PingUntil pings (count echoes a round) until a round gets at least atLeast replies, for at most rounds
// rounds: the first echoes to a neighbour not yet resolved are dropped while ARP or ND resolves it (once
// per hop). It returns the results of every round run, and whether the last one got enough replies.
func PingUntil(ctx context.Context, v *vppproc.VPP, source string, dst netip.Addr, count, atLeast, rounds int) ([]PingResult, bool, error) {
	var results []PingResult
	for range rounds {
		r, err := Ping(ctx, v, source, dst, count)
		if err != nil {
			return results, false, err
		}
		results = append(results, r)
		if r.Received >= atLeast {
			return results, true, nil
		}
	}
	return results, false, nil
}
