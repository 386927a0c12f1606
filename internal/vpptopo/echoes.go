package vpptopo

import (
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"time"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/bfd"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip_types"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
)

// Echoes is what one long run of VPP's ping reported, echo by echo: what a loss measurement reads.
type Echoes struct {
	PingResult
	// Interval is the time between two echoes.
	Interval time.Duration
	// Answered are the sequence numbers (1 to Sent) of the echoes answered, ascending.
	Answered []int
}

// LongestLoss returns the longest run of consecutive unanswered echoes: the longest outage, in echoes.
func (e Echoes) LongestLoss() int {
	longest, last := 0, 0
	for _, seq := range append(slices.Clone(e.Answered), e.Sent+1) {
		longest = max(longest, seq-last-1)
		last = seq
	}
	return longest
}

// Outage is LongestLoss in time: at Interval per echo, how long the flow got no answer.
func (e Echoes) Outage() time.Duration { return time.Duration(e.LongestLoss()) * e.Interval }

// AnsweredFrom returns how many of the echoes from sequence number seq on were answered.
func (e Echoes) AnsweredFrom(seq int) int {
	i, _ := slices.BinarySearch(e.Answered, seq)
	return len(e.Answered) - i
}

var echoReply = regexp.MustCompile(`icmp_seq=(\d+) `)

// ParseEchoes reads VPP's ping output: the statistics line and the sequence number of every reply.
func ParseEchoes(out string, interval time.Duration) (Echoes, error) {
	r, err := ParsePing(out)
	if err != nil {
		return Echoes{}, err
	}
	e := Echoes{PingResult: r, Interval: interval}
	for _, m := range echoReply.FindAllStringSubmatch(out, -1) {
		seq, _ := strconv.Atoi(m[1])
		e.Answered = append(e.Answered, seq)
	}
	slices.Sort(e.Answered)
	e.Answered = slices.Compact(e.Answered)
	return e, nil
}

// PingEvery runs VPP's ping on v: count echoes to dst every interval (VPP takes it to 1 ms; 10 to 20 ms
// measure an outage to that precision without loading a slow box), from the address of interface
// source. Several may run at once on one VPP (each CLI session is a VPP process of its own).
func PingEvery(ctx context.Context, v *vppproc.VPP, source string, dst netip.Addr, count int, interval time.Duration) (Echoes, error) {
	cmd := fmt.Sprintf("ping %s source %s repeat %d interval %.3f", dst, source, count, interval.Seconds())
	out, err := v.CLI(ctx, cmd)
	if err != nil {
		return Echoes{}, err
	}
	e, err := ParseEchoes(out, interval)
	if err != nil {
		return Echoes{}, fmt.Errorf("%s: %w", cmd, err)
	}
	return e, nil
}

// BFDSession is one BFD session of a node's VPP as it dumps it.
type BFDSession struct {
	// Interface is the uplink's name, or its sw_if_index if it is no uplink.
	Interface   string
	Local, Peer netip.Addr
	// Up is whether the session is Up (VPP forwards over its neighbour only then).
	Up bool
}

func (s BFDSession) String() string {
	state := "down"
	if s.Up {
		state = "up"
	}
	return fmt.Sprintf("%s %s->%s %s", s.Interface, s.Local, s.Peer, state)
}

// BFDSessions dumps node n's BFD sessions (bfd_udp_session_dump).
func (n *Node) BFDSessions(ctx context.Context) ([]BFDSession, error) {
	names := map[interface_types.InterfaceIndex]string{}
	for _, u := range n.Uplinks {
		idx, err := n.InterfaceIndex(ctx, u.Interface)
		if err != nil {
			return nil, err
		}
		names[interface_types.InterfaceIndex(idx)] = u.Interface
	}
	var out []BFDSession
	err := n.VPP.Call(ctx, func(ch api.Channel) error {
		req := ch.SendMultiRequest(&bfd.BfdUDPSessionDump{})
		for {
			d := new(bfd.BfdUDPSessionDetails)
			last, err := req.ReceiveReply(d)
			if err != nil || last {
				return err
			}
			name, ok := names[d.SwIfIndex]
			if !ok {
				name = fmt.Sprintf("sw_if_index %d", d.SwIfIndex)
			}
			out = append(out, BFDSession{Interface: name, Local: addr(d.LocalAddr), Peer: addr(d.PeerAddr),
				Up: d.State == bfd.BFD_STATE_API_UP})
		}
	})
	if err != nil {
		return nil, fmt.Errorf("%s: dump BFD sessions: %w", n.Name, err)
	}
	return out, nil
}

func addr(a ip_types.Address) netip.Addr {
	if a.Af == ip_types.ADDRESS_IP6 {
		return netip.AddrFrom16(a.Un.GetIP6())
	}
	return netip.AddrFrom4(a.Un.GetIP4())
}
