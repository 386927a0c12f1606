package vppsim

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/bfd"
	"go.fd.io/govpp/binapi/fib"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_neighbor"
	"go.fd.io/govpp/binapi/ipip"
	"go.fd.io/govpp/binapi/memclnt"
	"go.fd.io/govpp/binapi/teib"
	"go.fd.io/govpp/binapi/vlib"
	"go.fd.io/govpp/binapi/vpe"
	"go.fd.io/govpp/binapi/vxlan"
)

// memclntOrder is the order of the messages in VPP's memclnt.api. VPP numbers
// memclnt first, from 1, in this order, so ids 1-28 are the same in every build
// (GoVPP hard-codes 15 for sockclnt_create).
var memclntOrder = []string{
	"memclnt_create",            // 1
	"memclnt_create_reply",      // 2
	"memclnt_delete",            // 3
	"memclnt_delete_reply",      // 4
	"rx_thread_exit",            // 5
	"memclnt_rx_thread_suspend", // 6
	"memclnt_read_timeout",      // 7
	"rpc_call",                  // 8
	"rpc_call_reply",            // 9
	"get_first_msg_id",          // 10
	"get_first_msg_id_reply",    // 11
	"api_versions",              // 12
	"api_versions_reply",        // 13
	"trace_plugin_msg_ids",      // 14
	"sockclnt_create",           // 15
	"sockclnt_create_reply",     // 16
	"sockclnt_delete",           // 17
	"sockclnt_delete_reply",     // 18
	"sock_init_shm",             // 19
	"sock_init_shm_reply",       // 20
	"memclnt_keepalive",         // 21
	"memclnt_keepalive_reply",   // 22
	"control_ping",              // 23
	"control_ping_reply",        // 24
	"memclnt_create_v2",         // 25
	"memclnt_create_v2_reply",   // 26
	"get_api_json",              // 27
	"get_api_json_reply",        // 28
}

// firstDynamicID is the first message id that depends on the VPP build.
const firstDynamicID = 29

// binapiPackages are the binapi packages whose messages the simulator
// advertises after memclnt, in id order, those of the vxlan plugin only with
// vxlan. Messages without a handler get no reply, as in a VPP that has no
// handler registered for them.
func binapiPackages(withVXLAN bool) [][]api.Message {
	pkgs := [][]api.Message{
		vlib.AllMessages(),
		vpe.AllMessages(),
		interfaces.AllMessages(),
		ip.AllMessages(),
		ip_neighbor.AllMessages(),
		fib.AllMessages(),
		ipip.AllMessages(),
		teib.AllMessages(),
		bfd.AllMessages(),
	}
	if withVXLAN {
		pkgs = append(pkgs, vxlan.AllMessages())
	}
	return pkgs
}

// handlerFunc processes one decoded request on connection c. ctx is the
// request's context, to be echoed in every reply.
type handlerFunc func(s *Sim, c *conn, ctx uint32, msg api.Message)

// msgInfo describes one message of the table.
type msgInfo struct {
	id      uint16
	name    string
	crc     string // advertised CRC (an override or the real one)
	shape   api.MessageType
	typ     reflect.Type // struct type of the binapi message
	safe    bool         // decoding cannot allocate by a 32-bit count read from the wire
	handler handlerFunc
}

func (m *msgInfo) newMsg() api.Message {
	return reflect.New(m.typ).Interface().(api.Message)
}

// msgTable is the immutable message table of one Sim.
type msgTable struct {
	byID    []*msgInfo // indexed by message id; nil for unused ids
	byName  map[string]*msgInfo
	listing []memclnt.MessageTableEntry // sockclnt_create_reply table, in listing order
}

func (t *msgTable) lookup(id uint16) *msgInfo {
	if int(id) < len(t.byID) {
		return t.byID[id]
	}
	return nil
}

// id returns the id of the named message; it panics on a name that is not in
// the table, which would be a programming error in the simulator.
func (t *msgTable) id(name string) uint16 {
	mi, ok := t.byName[name]
	if !ok {
		panic("vppsim: message not in table: " + name)
	}
	return mi.id
}

// buildMsgTable numbers memclnt as real VPP does and every other message from
// firstDynamicID in a stable order, or in an order shuffled by seed when seed
// is not zero. CRC overrides replace the advertised CRC of a message. withVXLAN
// includes the vxlan plugin's messages.
func buildMsgTable(overrides map[string]string, seed int64, withVXLAN bool) (*msgTable, error) {
	mem := make(map[string]api.Message)
	for _, m := range memclnt.AllMessages() {
		mem[m.GetMessageName()] = m
	}
	if len(mem) != len(memclntOrder) {
		return nil, fmt.Errorf("memclnt has %d messages, expected %d", len(mem), len(memclntOrder))
	}
	ordered := make([]api.Message, 0, 512)
	for _, name := range memclntOrder {
		m, ok := mem[name]
		if !ok {
			return nil, fmt.Errorf("memclnt message %s missing from binapi", name)
		}
		ordered = append(ordered, m)
	}
	seen := make(map[string]bool, 512)
	for _, m := range ordered {
		seen[m.GetMessageName()] = true
	}
	var dynamic []api.Message
	for _, pkg := range binapiPackages(withVXLAN) {
		for _, m := range pkg {
			if seen[m.GetMessageName()] {
				continue // the same message in two packages: first one wins
			}
			seen[m.GetMessageName()] = true
			dynamic = append(dynamic, m)
		}
	}
	if seed != 0 {
		r := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
		r.Shuffle(len(dynamic), func(i, j int) { dynamic[i], dynamic[j] = dynamic[j], dynamic[i] })
	}
	ordered = append(ordered, dynamic...)

	t := &msgTable{
		byID:   make([]*msgInfo, len(ordered)+1),
		byName: make(map[string]*msgInfo, len(ordered)),
	}
	for i, m := range ordered {
		mi := &msgInfo{
			id:    uint16(i + 1),
			name:  m.GetMessageName(),
			crc:   m.GetCrcString(),
			shape: m.GetMessageType(),
			typ:   reflect.TypeOf(m).Elem(),
		}
		mi.safe = decodeIsBounded(mi.typ)
		mi.handler = handlers[mi.name]
		t.byID[mi.id] = mi
		t.byName[mi.name] = mi
	}
	for name, crc := range overrides {
		mi, ok := t.byName[name]
		if !ok {
			return nil, fmt.Errorf("CRC override for unknown message %q", name)
		}
		if !isCRC(crc) {
			return nil, fmt.Errorf("CRC override for %s: %q is not 8 hex digits", name, crc)
		}
		mi.crc = strings.ToLower(crc)
	}
	t.listing = make([]memclnt.MessageTableEntry, 0, len(ordered))
	for _, mi := range t.byID[1:] {
		t.listing = append(t.listing, memclnt.MessageTableEntry{Index: mi.id, Name: mi.name + "_" + mi.crc})
	}
	if seed != 0 {
		// Real VPP lists the table in hash order; GoVPP picks the id it sends
		// sockclnt_delete with from the listing order.
		r := rand.New(rand.NewPCG(uint64(seed), 0x0de7))
		r.Shuffle(len(t.listing), func(i, j int) { t.listing[i], t.listing[j] = t.listing[j], t.listing[i] })
	}
	return t, nil
}

func isCRC(s string) bool {
	if len(s) != 8 {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
			return false
		}
	}
	return true
}

// decodeIsBounded reports whether decoding the message type allocates no more
// than a small multiple of the wire size: generated binapi code allocates
// slices by a count read from the wire before checking the remaining length,
// so a 32-bit count from a hostile peer could allocate gigabytes.
func decodeIsBounded(t reflect.Type) bool {
	if t.Kind() != reflect.Struct {
		return true
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		ft := f.Type
		if ft.Kind() == reflect.Array {
			ft = ft.Elem()
		}
		if ft.Kind() == reflect.Slice {
			tag := f.Tag.Get("binapi")
			lb, rb := strings.IndexByte(tag, '['), strings.IndexByte(tag, ']')
			if lb < 0 || rb < lb {
				return false
			}
			n := tag[lb+1 : rb]
			if n == "" || strings.Trim(n, "0123456789") != "" {
				// Sized by a sibling count field: only an 8- or 16-bit count
				// is bounded.
				if !countIsSmall(t, n) {
					return false
				}
			}
			ft = ft.Elem()
		}
		if !decodeIsBounded(ft) {
			return false
		}
	}
	return true
}

func countIsSmall(t reflect.Type, name string) bool {
	for i := 0; i < t.NumField(); i++ {
		tag := t.Field(i).Tag.Get("binapi")
		if strings.Contains(tag+",", ",name="+name+",") {
			return strings.HasPrefix(tag, "u8,") || strings.HasPrefix(tag, "u16,")
		}
	}
	return false
}
