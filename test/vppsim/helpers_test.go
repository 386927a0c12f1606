package vppsim

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/api"
	"go.fd.io/govpp/codec"
	"go.fd.io/govpp/core"
)

func TestMain(m *testing.M) {
	// GoVPP logs every reconnect and timeout at warn level; the tests
	// provoke many on purpose.
	core.SetLogLevel(logrus.ErrorLevel)
	quiet := logrus.New()
	quiet.SetLevel(logrus.ErrorLevel)
	socketclient.SetLogger(quiet)
	// Faster health checks so that the restart tests run in seconds.
	core.HealthCheckProbeInterval = 200 * time.Millisecond
	core.HealthCheckReplyTimeout = 100 * time.Millisecond
	os.Exit(m.Run())
}

// socketPath returns a short socket path (unix sockets are limited to 108
// bytes, t.TempDir() paths can be longer).
func socketPath(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "vs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "api.sock")
}

// startSim starts a listening simulator, closed at the end of the test.
func startSim(t testing.TB, cfg Config) *Sim {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := s.Listen(socketPath(t)); err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// connect connects GoVPP's real socketclient to the simulator.
func connect(t testing.TB, s *Sim) *core.Connection {
	t.Helper()
	conn, err := core.Connect(socketclient.NewVppClient(s.SocketPath()))
	if err != nil {
		t.Fatalf("core.Connect: %v", err)
	}
	t.Cleanup(conn.Disconnect)
	return conn
}

// channel returns an API channel with a reply timeout.
func channel(t testing.TB, conn *core.Connection) api.Channel {
	t.Helper()
	ch, err := conn.NewAPIChannel()
	if err != nil {
		t.Fatalf("NewAPIChannel: %v", err)
	}
	ch.SetReplyTimeout(2 * time.Second)
	t.Cleanup(ch.Close)
	return ch
}

// rawClient speaks the wire protocol directly, to check framing and header
// fields GoVPP hides.
type rawClient struct {
	t     testing.TB
	s     *Sim
	nc    net.Conn
	index uint32
}

func dialRaw(t testing.TB, s *Sim) *rawClient {
	t.Helper()
	nc, err := net.Dial("unix", s.SocketPath())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return &rawClient{t: t, s: s, nc: nc}
}

// writeFrame writes a payload with a header whose ignored bytes hold garbage,
// as GoVPP's reused buffers may.
func (r *rawClient) writeFrame(payload []byte) {
	r.t.Helper()
	hdr := []byte{0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 0, 0, 0, 0, 9, 9, 9, 9}
	binary.BigEndian.PutUint32(hdr[8:12], uint32(len(payload)))
	if _, err := r.nc.Write(append(hdr, payload...)); err != nil {
		r.t.Fatalf("write: %v", err)
	}
}

// encode encodes msg with the simulator's id for it and sets the header
// fields of a request-shaped message (or the context of a reply-shaped one).
func (r *rawClient) encode(msg api.Message, clientIndex, ctx uint32) []byte {
	r.t.Helper()
	data, err := codec.DefaultCodec.EncodeMsg(msg, r.s.table.id(msg.GetMessageName()))
	if err != nil {
		r.t.Fatalf("encode %s: %v", msg.GetMessageName(), err)
	}
	switch msg.GetMessageType() {
	case api.RequestMessage:
		binary.BigEndian.PutUint32(data[2:6], clientIndex)
		binary.BigEndian.PutUint32(data[6:10], ctx)
	case api.ReplyMessage:
		binary.BigEndian.PutUint32(data[2:6], ctx)
	}
	return data
}

func (r *rawClient) send(msg api.Message, ctx uint32) {
	r.t.Helper()
	r.writeFrame(r.encode(msg, r.index, ctx))
}

// readFrame reads one frame's payload, or returns nil after timeout.
func (r *rawClient) readFrame(timeout time.Duration) []byte {
	r.t.Helper()
	_ = r.nc.SetReadDeadline(time.Now().Add(timeout))
	defer func() { _ = r.nc.SetReadDeadline(time.Time{}) }()
	var hdr [16]byte
	if _, err := io.ReadFull(r.nc, hdr[:]); err != nil {
		return nil
	}
	p := make([]byte, binary.BigEndian.Uint32(hdr[8:12]))
	if _, err := io.ReadFull(r.nc, p); err != nil {
		r.t.Fatalf("read payload: %v", err)
	}
	if len(p) < 6 {
		r.t.Fatalf("frame payload of %d bytes: GoVPP would panic", len(p))
	}
	return p
}

// decode decodes a payload into a new message of the type its id names.
func (r *rawClient) decode(p []byte) api.Message {
	r.t.Helper()
	mi := r.s.table.lookup(binary.BigEndian.Uint16(p))
	if mi == nil {
		r.t.Fatalf("frame with unknown id %d", binary.BigEndian.Uint16(p))
	}
	msg := mi.newMsg()
	if err := codec.DefaultCodec.DecodeMsg(p, msg); err != nil {
		r.t.Fatalf("decode %s: %v", mi.name, err)
	}
	return msg
}
