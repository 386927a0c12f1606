package vpptopo

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Command runs name with args and returns its combined output; its error names the command and carries
// the output.
func Command(name string, args ...string) (string, error) {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// VXLANNetns is a Linux network namespace, named so, whose kernel makes VXLAN devices: where a test puts
// a node configured as felix configures one (vxlan.calico) beside VPPs. Needs root and iproute2.
type VXLANNetns string

// NewVXLANNetns creates network namespace name and checks that a VXLAN device can be made in it; its
// error says why not (the caller skips the test), the namespace then gone again.
func NewVXLANNetns(name string) (VXLANNetns, error) {
	if _, err := exec.LookPath("ip"); err != nil {
		return "", fmt.Errorf("needs iproute2's ip: %w", err)
	}
	if _, err := Command("ip", "netns", "add", name); err != nil {
		return "", err
	}
	ns := VXLANNetns(name)
	if _, err := ns.Exec("ip", "link", "add", "vxprobe", "type", "vxlan", "id", "1", "dstport", "4789"); err != nil {
		ns.Delete()
		return "", fmt.Errorf("the kernel has no VXLAN: %w", err)
	}
	if _, err := ns.Exec("ip", "link", "del", "vxprobe"); err != nil {
		ns.Delete()
		return "", err
	}
	return ns, nil
}

// Exec runs a command inside the namespace (ip netns exec), as Command does.
func (ns VXLANNetns) Exec(args ...string) (string, error) {
	return Command("ip", append([]string{"netns", "exec", string(ns)}, args...)...)
}

// Delete deletes the namespace, and with it the interfaces in it (a veth pair's other end too).
func (ns VXLANNetns) Delete() { _, _ = Command("ip", "netns", "del", string(ns)) }

// PingFromNetns sends count ICMP echoes from src to dst inside network namespace ns (a raw socket on a
// thread of its own that enters ns and then ends with its goroutine; no ping binary needed) and
// returns how many were answered within a second each. Needs root.
func PingFromNetns(ns string, src, dst netip.Addr, count int) (int, error) {
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread, in ns, ends with the goroutine
		n, err := func() (int, error) {
			f, err := os.Open(filepath.Join("/var/run/netns", ns))
			if err != nil {
				return 0, err
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				return 0, fmt.Errorf("setns %s: %w", ns, err)
			}
			fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
			if err != nil {
				return 0, err
			}
			defer unix.Close(fd)
			if err := unix.Bind(fd, &unix.SockaddrInet4{Addr: src.As4()}); err != nil {
				return 0, fmt.Errorf("bind %v: %w", src, err)
			}
			tv := unix.NsecToTimeval(time.Second.Nanoseconds())
			if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
				return 0, err
			}
			id := uint16(os.Getpid())
			answered := 0
			for seq := range count {
				// 56 bytes of data, as ping(8) sends (with an odd length the replies VPP sent through
				// af_packet never reached vxlan.calico, not investigated).
				echo := append([]byte{8, 0, 0, 0, byte(id >> 8), byte(id), 0, byte(seq)}, make([]byte, 56)...)
				sum := inetChecksum(echo)
				echo[2], echo[3] = byte(sum>>8), byte(sum)
				if err := unix.Sendto(fd, echo, 0, &unix.SockaddrInet4{Addr: dst.As4()}); err != nil {
					return answered, fmt.Errorf("send echo: %w", err)
				}
				buf := make([]byte, 1500)
				for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
					n, _, err := unix.Recvfrom(fd, buf, 0)
					if err != nil {
						break // timed out
					}
					if n < 20 {
						continue
					}
					icmp := buf[int(buf[0]&0x0f)*4 : n]
					if len(icmp) >= 8 && icmp[0] == 0 && icmp[4] == byte(id>>8) && icmp[5] == byte(id) && icmp[7] == byte(seq) &&
						netip.AddrFrom4([4]byte(buf[12:16])) == dst {
						answered++
						break
					}
				}
			}
			return answered, nil
		}()
		done <- result{n, err}
	}()
	r := <-done
	return r.n, r.err
}

// inetChecksum is the Internet checksum of b.
func inetChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}
