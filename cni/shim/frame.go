package shim

import (
	"errors"
	"fmt"
)

// Magic begins every frame of this protocol, request and reply. Plugin and daemon are installed
// together from one release; either refuses a frame without it (one of another release).
//
// A frame is Magic, the length of its records (uvarint), and its records (Seal): the reader knows
// where a frame ends without the writer shutting its side down. So the plugin keeps its side open
// while it waits, and its hang-up is the one thing that ends a read of the daemon's (as net/http's
// background read notices a client that went away), with no epoll.
const Magic = "block-ipam/3\n"

// MaxFrame bounds a request or a reply.
const MaxFrame = 1 << 20

// Keys of the request frame besides the CNI_* environment variables, which travel under their
// own names.
const (
	// KeyStdin is the network configuration as the runtime wrote it.
	KeyStdin = "stdin"
	// KeyPID is the plugin's process ID, for its log line.
	KeyPID = "pid"
	// KeyNetNS is what the plugin found of CNI_NETNS for ADD and DEL: NetNSOwn, NetNSOther, or an
	// error message when it could not read its own network namespace. Absent when not checked
	// (other verbs, CNI_NETNS_OVERRIDE).
	KeyNetNS = "netns"
	// KeyResolvConf is the content of ipam.resolvConf for ADD, read by the plugin, which runs in the
	// runtime's mount namespace (the daemon may not); KeyResolvConfErr why it could not be read.
	KeyResolvConf    = "resolvConf"
	KeyResolvConfErr = "resolvConf.err"
)

// Values of KeyNetNS.
const (
	NetNSOwn   = "own"
	NetNSOther = "other"
)

// Keys of the reply frame.
const (
	// KeyExit is the plugin's exit code, "0" or "1".
	KeyExit = "exit"
	// KeyStdout is what the plugin prints: the result or the CNI error, rendered as skel prints it.
	KeyStdout = "stdout"
	// KeyLog is the plugin's log line (with its newline), which the plugin appends to the log_file
	// it read from the configuration (stderr without one).
	KeyLog = "log"
	// The daemon's figures of the call, in decimal, when it served the request (the plugin ignores
	// them; tests and benchmarks read them here rather than from the log line): its node, the
	// operation's optimistic attempts, the other requests its writes served, its etcd round trips,
	// and GC's releases.
	KeyNode       = "node"
	KeyAttempts   = "attempts"
	KeyBatched    = "batched"
	KeyRoundTrips = "etcd_round_trips"
	KeyReleased   = "released"
)

// Env lists the CNI environment variables a request frame carries.
var Env = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH", "CNI_NETNS_OVERRIDE"}

// Seal returns the frame of records (built with AppendRecord from nil): Magic, their length, them.
func Seal(records []byte) []byte {
	out := make([]byte, 0, len(Magic)+10+len(records))
	out = appendUvarint(append(out, Magic...), uint64(len(records)))
	return append(out, records...)
}

// FrameSize returns the size of the frame that head begins, once head holds its Magic and length;
// ok is false before that, and when head is not the beginning of a frame (then only the writer's
// end of the stream ends it).
func FrameSize(head []byte) (size int, ok bool) {
	if len(head) < len(Magic) || string(head[:len(Magic)]) != Magic {
		return 0, false
	}
	n, rest, err := uvarint(head[len(Magic):])
	if err != nil || n > 1<<40 {
		return 0, false
	}
	return len(head) - len(rest) + int(n), true
}

// AppendRecord appends one record, key and value each preceded by its length (uvarint), to a frame.
func AppendRecord(frame []byte, key string, value []byte) []byte {
	frame = appendUvarint(frame, uint64(len(key)))
	frame = append(frame, key...)
	frame = appendUvarint(frame, uint64(len(value)))
	return append(frame, value...)
}

func appendUvarint(b []byte, v uint64) []byte {
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// ParseFrame returns the records of a frame (Seal). A frame shorter or longer than its length says is
// an error (a reply cut short), and so is a key given twice: no record may be overridden by a later
// one.
func ParseFrame(frame []byte) (map[string][]byte, error) {
	if len(frame) < len(Magic) || string(frame[:len(Magic)]) != Magic {
		return nil, errors.New("not a " + Magic[:len(Magic)-1] + " frame")
	}
	n, b, err := uvarint(frame[len(Magic):])
	switch {
	case err != nil:
		return nil, fmt.Errorf("frame: length: %w", err)
	case n > uint64(len(b)):
		return nil, fmt.Errorf("frame: truncated: %d bytes of %d", len(b), n)
	case n < uint64(len(b)):
		return nil, fmt.Errorf("frame: %d bytes after its end", uint64(len(b))-n)
	}
	out := map[string][]byte{}
	for len(b) > 0 {
		key, rest, err := field(b)
		if err != nil {
			return nil, fmt.Errorf("frame: key: %w", err)
		}
		value, rest, err := field(rest)
		if err != nil {
			return nil, fmt.Errorf("frame: value of %q: %w", key, err)
		}
		if _, dup := out[string(key)]; dup {
			return nil, fmt.Errorf("frame: %q given twice", key)
		}
		out[string(key)] = value
		b = rest
	}
	return out, nil
}

// uvarint reads a length.
func uvarint(b []byte) (n uint64, rest []byte, err error) {
	for i := 0; ; i++ {
		if i >= len(b) || i >= 10 {
			return 0, nil, errors.New("truncated length")
		}
		n |= uint64(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			return n, b[i+1:], nil
		}
	}
}

func field(b []byte) (value, rest []byte, err error) {
	n, b, err := uvarint(b)
	if err != nil {
		return nil, nil, err
	}
	if n > uint64(len(b)) {
		return nil, nil, errors.New("truncated")
	}
	return b[:n], b[n:], nil
}
