package vppsim

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/fib_types"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/memclnt"
	"go.fd.io/govpp/binapi/vpe"
	"go.fd.io/govpp/codec"
)

// clientPlaceholder in a fuzz input is replaced by the connection's client
// index, so that mutated requests get past the client_index check.
var clientPlaceholder = []byte{0xc1, 0xc1, 0xc1, 0xc1}

// fuzzFrame encodes msg as a frame for the default message table, with the
// client placeholder in request headers.
func fuzzFrame(tb testing.TB, table *msgTable, msg api.Message, ctx uint32) []byte {
	data, err := codec.DefaultCodec.EncodeMsg(msg, table.id(msg.GetMessageName()))
	if err != nil {
		tb.Fatal(err)
	}
	switch msg.GetMessageType() {
	case api.RequestMessage:
		copy(data[2:6], clientPlaceholder)
		binary.BigEndian.PutUint32(data[6:10], ctx)
	case api.ReplyMessage:
		binary.BigEndian.PutUint32(data[2:6], ctx)
	}
	frame := make([]byte, 16, 16+len(data))
	binary.BigEndian.PutUint32(frame[8:12], uint32(len(data)))
	return append(frame, data...)
}

// FuzzServerFrames feeds arbitrary bytes, after a real handshake, to a
// simulator connection. The server must not panic or hang, and every frame
// it sends must be one GoVPP can read: payload of at least 6 bytes, a known
// message id, and a body that GoVPP's codec decodes.
func FuzzServerFrames(f *testing.F) {
	s := startSim(f, Config{Interfaces: []string{"eth0", "eth1"}})
	tbl := s.table
	seed := func(msgs ...api.Message) {
		var b []byte
		for i, m := range msgs {
			b = append(b, fuzzFrame(f, tbl, m, uint32(i+1))...)
		}
		f.Add(b)
	}
	seed()
	seed(&memclnt.ControlPing{})
	seed(&vpe.ShowVersion{}, &memclnt.ControlPing{})
	seed(&interfaces.SwInterfaceDump{SwIfIndex: ^interface_types.InterfaceIndex(0), NameFilterValid: true, NameFilter: "eth"}, &memclnt.ControlPing{})
	seed(&interfaces.SwInterfaceSetFlags{SwIfIndex: 1, Flags: 1}, addrReq(1, true, "172.16.0.1/24"), &ip.IPAddressDump{SwIfIndex: 1}, &memclnt.ControlPing{})
	seed(&interfaces.WantInterfaceEvents{EnableDisable: 1, PID: 7}, &interfaces.SwInterfaceSetFlags{SwIfIndex: 2, Flags: 1})
	seed(&ip.IPTableAddDel{IsAdd: true, Table: ip.IPTable{TableID: 3}}, &ip.IPTableDump{}, &memclnt.ControlPing{})
	seed(routeReq(true, false, 0, "10.1.2.5/26", nhPath("172.16.0.2", 1)), routeReq(true, true, 0, "10.1.2.0/26", nhPath("172.16.0.3", 2)),
		&ip.IPRouteDump{}, &memclnt.ControlPing{}, routeReq(false, false, 0, "10.1.2.0/26"))
	seed(routeReq(true, false, 0, "2001:db8::/64", nhPath("fd00::1", 1), fib_types.FibPath{Type: fib_types.FIB_API_PATH_TYPE_DROP}))
	seed(&memclnt.SockclntDelete{}, &memclnt.ControlPing{})
	seed(&memclnt.SockclntCreate{Name: "again"}, &memclnt.RPCCall{})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})              // empty payload
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0})  // absurd length
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 23, 0xc1}) // truncated ping

	f.Fuzz(func(t *testing.T, in []byte) {
		r := dialRaw(t, s)
		r.handshake()
		var idx [4]byte
		binary.BigEndian.PutUint32(idx[:], r.index)
		in = bytes.ReplaceAll(in, clientPlaceholder, idx[:])

		frames := make(chan error, 1)
		go func() { frames <- checkFrames(s, r.nc) }()
		_, _ = r.nc.Write(in) // the server may hang up early (sockclnt_delete)
		_ = r.nc.(*net.UnixConn).CloseWrite()
		select {
		case err := <-frames:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("server did not finish the input within 10s")
		}
	})
}

// checkFrames reads frames until EOF and checks each is GoVPP-readable.
func checkFrames(s *Sim, nc net.Conn) error {
	_ = nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	var hdr [16]byte
	for {
		if _, err := io.ReadFull(nc, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err) {
				return nil
			}
			return err
		}
		p := make([]byte, binary.BigEndian.Uint32(hdr[8:12]))
		if _, err := io.ReadFull(nc, p); err != nil {
			return err
		}
		if len(p) < 6 {
			return errors.New("frame payload shorter than 6 bytes")
		}
		mi := s.table.lookup(binary.BigEndian.Uint16(p))
		if mi == nil {
			return errors.New("frame with an unknown message id")
		}
		if err := codec.DefaultCodec.DecodeMsg(p, mi.newMsg()); err != nil {
			return err
		}
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}
