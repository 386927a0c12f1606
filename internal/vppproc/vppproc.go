// Package vppproc runs a real fd.io VPP as a child process for tests and the local lab: no DPDK, no
// hugepages, no root, every socket and log in one short run directory, an uplink created by
// startup-config (so that it appears 2 s after VPP starts, as on a real node).
//
// The VPP comes from VPP_PKG, a package directory with bin/vpp and bin/vppctl (an unpacked build such as
// a minimal VPP 26.06 in /opt/vpp-v26.06-minimal), or else from a vpp and vppctl on PATH (fd.io's packages).
package vppproc

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/fib_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/core"
)

// EnvPackage names the environment variable with the unpacked VPP package directory.
const EnvPackage = "VPP_PKG"

// Uplink is the interface the default startup-config creates: "create loopback interface" makes loop0,
// sw_if_index 1.
const Uplink = "loop0"

// HowToGet tells a user without a VPP how to get one.
const HowToGet = "no VPP found: install fd.io's vpp package (vpp and vppctl on PATH; https://fd.io/docs/vpp/master/gettingstarted/installing/),\n" +
	"or set VPP_PKG to a VPP package directory (bin/vpp, bin/vppctl), e.g. a build unpacked into /opt: VPP_PKG=/opt/vpp-v26.06-minimal"

// ErrNoVPP is returned by Find when there is no VPP to run.
var ErrNoVPP = errors.New(HowToGet)

// Binaries are the programs of one VPP installation.
type Binaries struct {
	VPP, VPPCtl string
}

// PluginDir returns the directory of VPP's plugins in the package the binaries come from
// (lib/<arch>/vpp_plugins beside bin/).
func (b Binaries) PluginDir() (string, error) {
	pattern := filepath.Join(filepath.Dir(filepath.Dir(b.VPP)), "lib", "*", "vpp_plugins")
	dirs, _ := filepath.Glob(pattern)
	if len(dirs) == 0 {
		return "", fmt.Errorf("no VPP plugin directory %s", pattern)
	}
	return dirs[0], nil
}

// Find locates VPP: VPP_PKG first, then PATH.
func Find() (Binaries, error) {
	if pkg := os.Getenv(EnvPackage); pkg != "" {
		b := Binaries{VPP: filepath.Join(pkg, "bin", "vpp"), VPPCtl: filepath.Join(pkg, "bin", "vppctl")}
		for _, p := range []string{b.VPP, b.VPPCtl} {
			if _, err := os.Stat(p); err != nil {
				return Binaries{}, fmt.Errorf("%s=%s: %w", EnvPackage, pkg, err)
			}
		}
		return b, nil
	}
	vpp, err1 := exec.LookPath("vpp")
	ctl, err2 := exec.LookPath("vppctl")
	if err1 != nil || err2 != nil {
		return Binaries{}, ErrNoVPP
	}
	return Binaries{VPP: vpp, VPPCtl: ctl}, nil
}

// FromPackage returns the binaries of an unpacked package directory (make lab's --vpp).
func FromPackage(dir string) (Binaries, error) {
	b := Binaries{VPP: filepath.Join(dir, "bin", "vpp"), VPPCtl: filepath.Join(dir, "bin", "vppctl")}
	for _, p := range []string{b.VPP, b.VPPCtl} {
		if _, err := os.Stat(p); err != nil {
			return Binaries{}, fmt.Errorf("VPP package %s: %w", dir, err)
		}
	}
	return b, nil
}

// Options configure one VPP.
type Options struct {
	// Dir is the run directory, created if missing. Keep it short: unix socket paths are limited to 107
	// bytes.
	Dir string
	// Setup are the CLI commands of startup-config, run 2 s after VPP starts; nil means
	// {"create loopback interface"} (loop0).
	Setup []string
	// APITrace records every API message VPP receives from the start (startup.conf's api-trace), for
	// `api trace dump`.
	APITrace bool
	// Plugins are the plugins to load, by file name ("memif_plugin.so"), from the package's
	// lib/*/vpp_plugins; none by default (the minimal build has none).
	Plugins []string
	// InterruptMode makes every interface's receive queues interrupt-driven (startup.conf's
	// `interface { default-rx-mode interrupt }`): a polled memif queue costs one whole CPU per VPP.
	InterruptMode bool
	// HeapMB is the main heap size in MB; 0 means 256. VPP does not start with less than 128.
	HeapMB int
}

// VPP is one running (or stopped) VPP process.
type VPP struct {
	bin  Binaries
	opts Options
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	// Started is when the current process was started.
	Started time.Time
}

// Socket returns the path of the binary API socket.
func (v *VPP) Socket() string { return filepath.Join(v.opts.Dir, "api.sock") }

// CLISocket returns the path of the CLI socket (vppctl -s).
func (v *VPP) CLISocket() string { return filepath.Join(v.opts.Dir, "cli.sock") }

// Dir returns the run directory.
func (v *VPP) Dir() string { return v.opts.Dir }

// CtlCommand returns the vppctl command line an operator runs against this VPP.
func (v *VPP) CtlCommand() string { return v.bin.VPPCtl + " -s " + v.CLISocket() }

// PID returns the pid of the running process (VPP's vpe_pid), 0 if none.
func (v *VPP) PID() int {
	if v.cmd == nil || v.cmd.Process == nil {
		return 0
	}
	return v.cmd.Process.Pid
}

// Start writes the configuration and starts VPP, returning once its API socket accepts (about 0.1 s; the
// startup-config interfaces come 2 s after that).
func Start(ctx context.Context, bin Binaries, opts Options) (*VPP, error) {
	if len(filepath.Join(opts.Dir, "api.sock")) > 107 {
		return nil, fmt.Errorf("run directory %s is too long for a unix socket path", opts.Dir)
	}
	if opts.Setup == nil {
		opts.Setup = []string{"create loopback interface"}
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	if opts.HeapMB == 0 {
		opts.HeapMB = 256
	}
	v := &VPP{bin: bin, opts: opts}
	if err := v.writeConfig(); err != nil {
		return nil, err
	}
	return v, v.start(ctx)
}

func (v *VPP) writeConfig() error {
	dir := v.opts.Dir
	prefix := fmt.Sprintf("vpp%d", crc32.ChecksumIEEE([]byte(dir)))
	conf := fmt.Sprintf(`unix {
  nodaemon
  nosyslog
  cli-listen %[1]s/cli.sock
  runtime-dir %[1]s
  log %[1]s/vpp.log
  startup-config %[1]s/setup.cli
}
api-segment { prefix %[2]s }
socksvr { socket-name %[1]s/api.sock }
statseg { socket-name %[1]s/stats.sock size 8M page-size 4k }
memory { main-heap-size %[3]dM main-heap-page-size 4k }
buffers { buffers-per-numa 4096 page-size 4k }
`, dir, prefix, v.opts.HeapMB)
	if len(v.opts.Plugins) == 0 {
		conf += "plugins { plugin default { disable } }\n"
	} else {
		pluginDir, err := v.bin.PluginDir()
		if err != nil {
			return err
		}
		conf += "plugins {\n  path " + pluginDir + "\n  plugin default { disable }\n"
		for _, p := range v.opts.Plugins {
			if _, err := os.Stat(filepath.Join(pluginDir, p)); err != nil {
				return fmt.Errorf("VPP plugin %s: %w", p, err)
			}
			conf += "  plugin " + p + " { enable }\n"
		}
		conf += "}\n"
	}
	if v.opts.InterruptMode {
		conf += "interface { default-rx-mode interrupt }\n"
	}
	if v.opts.APITrace {
		conf += "api-trace { on }\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "startup.conf"), []byte(conf), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "setup.cli"), []byte(strings.Join(v.opts.Setup, "\n")+"\n"), 0o644)
}

func (v *VPP) start(ctx context.Context) error {
	for _, s := range []string{"api.sock", "cli.sock", "stats.sock"} {
		_ = os.Remove(filepath.Join(v.opts.Dir, s)) // VPP leaves its sockets behind
	}
	out, err := os.OpenFile(filepath.Join(v.opts.Dir, "output.txt"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(v.bin.VPP, "-c", filepath.Join(v.opts.Dir, "startup.conf"))
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test or the lab
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", v.bin.VPP, err)
	}
	v.cmd, v.done, v.Started = cmd, make(chan struct{}), time.Now()
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(v.done)
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.Dial("unix", v.Socket())
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-v.done:
			log, _ := os.ReadFile(filepath.Join(v.opts.Dir, "output.txt"))
			return fmt.Errorf("VPP exited at start: %s\n%s", cmd.ProcessState, lastLines(string(log), 20))
		case <-ctx.Done():
			v.Stop()
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			v.Stop()
			return fmt.Errorf("VPP API socket %s not accepting after 15s", v.Socket())
		}
	}
}

// Stop sends SIGTERM and waits for VPP to exit (about 2 s), killing it after 10 s. It leaves the socket
// files behind, as VPP does.
func (v *VPP) Stop() {
	if v.cmd == nil {
		return
	}
	_ = v.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-v.done:
	case <-time.After(10 * time.Second):
		_ = v.cmd.Process.Kill()
		<-v.done
	}
	v.cmd = nil
}

// Signal sends sig to the running VPP (SIGSTOP freezes it: its sockets stay open and nothing answers;
// SIGCONT thaws it).
func (v *VPP) Signal(sig os.Signal) error {
	if v.cmd == nil || v.cmd.Process == nil {
		return errors.New("vppproc: VPP is not running")
	}
	return v.cmd.Process.Signal(sig)
}

// Restart stops VPP and starts it again in the same directory: a new pid, an empty FIB, and the
// startup-config interfaces absent for the first 2 s.
func (v *VPP) Restart(ctx context.Context) error {
	v.Stop()
	return v.start(ctx)
}

// CLI runs one vppctl command and returns its output.
func (v *VPP) CLI(ctx context.Context, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, v.bin.VPPCtl, "-s", v.CLISocket(), command).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("vppctl %s: %w: %s", command, err, out)
	}
	return string(out), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Route is one route of a table as VPP dumps it for a source.
type Route struct {
	Prefix netip.Prefix // masked
	// Source is VPP's fib_source_t (8: API).
	Source uint8
	Paths  []Path
}

// Path is one path of a dumped route: its next hop (the zero Addr if none) and interface (~0 if none).
type Path struct {
	NextHop   netip.Addr
	SwIfIndex uint32
}

// SourceAPI is VPP's FIB_SOURCE_API.
const SourceAPI = 8

// Routes dumps table 0, IPv4 then IPv6, with ip_route_v2_dump for source src (0: every entry with its
// best source), over a connection of its own.
func (v *VPP) Routes(ctx context.Context, src uint8) ([]Route, error) {
	return v.TableRoutes(ctx, 0, src)
}

// TableRoutes is Routes for table id table (none if it does not exist).
func (v *VPP) TableRoutes(ctx context.Context, table uint32, src uint8) ([]Route, error) {
	var out []Route
	err := v.Call(ctx, func(ch api.Channel) error {
		for _, ip6 := range []bool{false, true} {
			req := ch.SendMultiRequest(&ip.IPRouteV2Dump{Src: src, Table: ip.IPTable{TableID: table, IsIP6: ip6}})
			for {
				d := new(ip.IPRouteV2Details)
				last, err := req.ReceiveReply(d)
				if err != nil {
					return err
				}
				if last {
					break
				}
				r := Route{Prefix: netip.PrefixFrom(fromAPI(d.Route.Prefix.Address), int(d.Route.Prefix.Len)).Masked(), Source: d.Route.Src}
				for _, p := range d.Route.Paths {
					var nh netip.Addr
					switch p.Proto {
					case fib_types.FIB_API_PATH_NH_PROTO_IP4:
						nh = netip.AddrFrom4(p.Nh.Address.GetIP4())
					case fib_types.FIB_API_PATH_NH_PROTO_IP6:
						nh = netip.AddrFrom16(p.Nh.Address.GetIP6())
					}
					if nh.IsUnspecified() {
						nh = netip.Addr{}
					}
					r.Paths = append(r.Paths, Path{NextHop: nh, SwIfIndex: p.SwIfIndex})
				}
				out = append(out, r)
			}
		}
		return nil
	})
	return out, err
}

// Call runs f on a GoVPP channel of a connection of its own, every reply within 5 s.
func (v *VPP) Call(ctx context.Context, f func(api.Channel) error) error {
	conn, err := core.Connect(socketclient.NewVppClient(v.Socket()))
	if err != nil {
		return fmt.Errorf("connect to VPP at %s: %w", v.Socket(), err)
	}
	ch, err := conn.NewAPIChannel()
	if err != nil {
		conn.Disconnect()
		return err
	}
	ch.SetReplyTimeout(5 * time.Second)
	done := make(chan error, 1)
	// The goroutine running f closes the channel and the connection once f is done with them (each reply
	// within 5 s), also when ctx ends first and Call has returned: closing them under f races with it.
	go func() {
		defer conn.Disconnect()
		defer ch.Close()
		done <- f(ch)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func fromAPI(a ip_types.Address) netip.Addr {
	if a.Af == ip_types.ADDRESS_IP6 {
		return netip.AddrFrom16(a.Un.GetIP6())
	}
	return netip.AddrFrom4(a.Un.GetIP4())
}
