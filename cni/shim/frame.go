package shim

import (
	"errors"
	"fmt"
)

// Magic begins every frame of this protocol, request and reply. Plugin and daemon are installed
// together from one release; either refuses a frame without it (one of another release).
const Magic = "block-ipam/2\n"

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
)

// Env lists the CNI environment variables a request frame carries.
var Env = []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH", "CNI_NETNS_OVERRIDE"}

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

// ParseFrame returns the records of a frame that begins with Magic. A key given twice is an error:
// no record may be overridden by a later one.
func ParseFrame(frame []byte) (map[string][]byte, error) {
	if len(frame) < len(Magic) || string(frame[:len(Magic)]) != Magic {
		return nil, errors.New("not a block-ipam/2 frame")
	}
	b := frame[len(Magic):]
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

func field(b []byte) (value, rest []byte, err error) {
	var n uint64
	for i := 0; ; i++ {
		if i >= len(b) || i >= 10 {
			return nil, nil, errors.New("truncated length")
		}
		n |= uint64(b[i]&0x7f) << (7 * i)
		if b[i] < 0x80 {
			b = b[i+1:]
			break
		}
	}
	if n > uint64(len(b)) {
		return nil, nil, errors.New("truncated")
	}
	return b[:n], b[n:], nil
}
