// Command vppsim runs the VPP binary-API simulator (package test/vppsim) as a
// standalone process, for the local lab and process-level tests:
//
//	vppsim --socket PATH [--interface NAME]... [--version TEXT] [--crc NAME=CRC]... [--http ADDR]
//	       [--interfaces-after DURATION | --interfaces-on-demand] [--reply-delay DURATION] [--hang-up-after N] [--stall]
//	       [--no-vxlan]
//
// --no-vxlan leaves the vxlan plugin's messages out of the message table, as in VPP's minimal build.
//
// The fault flags play a real VPP's behaviours and failures for process-level tests: interfaces created
// by VPP's startup-config appear 2 s after every (re)start (--interfaces-after 2s) or when the test says so
// (--interfaces-on-demand, then POST /interfaces after each start), a busy main thread
// (--reply-delay), a VPP that drops each connection after N messages (--hang-up-after), and one that
// stops answering (--stall: requests applied, nothing answered, pings included).
//
// It prints one line "vppsim ready socket=PATH pid=N" (followed by
// " http=ADDR" when --http is set) to stdout once the socket accepts, runs
// until SIGTERM or SIGINT, and simulates a VPP restart on SIGHUP, printing
// "vppsim restarted pid=N". With --http it serves GET /fib (JSON array of
// every table's routes; ?source=api keeps only API routes), GET /interfaces,
// GET /requests (JSON object: message name -> count) and
// POST /neighbor?sw_if_index=N&address=A (a resolved neighbour: VPP's
// adjacency /32) and POST /interfaces (the interfaces appear now).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sync/errgroup"

	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

// errUsage marks a command-line error (exit status 2).
var errUsage = errors.New("usage error")

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "vppsim:", err)
		if errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

// options are the parsed command-line flags.
type options struct {
	socket     string
	interfaces []string
	version    string
	crcs       []string
	httpAddr   string
	debug      bool
	faults     vppsim.Faults
	stall      bool
}

func parseFlags(args []string, stderr io.Writer) (options, vppsim.Config, error) {
	var o options
	fs := pflag.NewFlagSet("vppsim", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.socket, "socket", "", "path of the VPP API unix socket to create (required)")
	fs.StringArrayVar(&o.interfaces, "interface", nil, "interface name, sw_if_index 1..N in order (repeatable; default "+vppsim.DefaultInterface+")")
	fs.StringVar(&o.version, "version", vppsim.DefaultVersion, "version reported by show_version")
	fs.StringArrayVar(&o.crcs, "crc", nil, "NAME=CRC: advertise CRC for message NAME instead of the real one (repeatable)")
	fs.StringVar(&o.httpAddr, "http", "", "serve GET /fib, /interfaces and /requests on this address (e.g. 127.0.0.1:0)")
	fs.BoolVar(&o.debug, "debug", false, "log per-connection events")
	var ifDelay time.Duration
	fs.DurationVar(&ifDelay, "interfaces-after", 0, "the interfaces appear this long after start and after every restart (VPP's startup-config: 2s)")
	var ifOnDemand, noVXLAN bool
	fs.BoolVar(&noVXLAN, "no-vxlan", false, "no vxlan plugin: its messages are not in the message table (VPP's minimal build)")
	fs.BoolVar(&ifOnDemand, "interfaces-on-demand", false, "the interfaces appear only on POST /interfaces, after start and after every restart")
	fs.DurationVar(&o.faults.ReplyDelay, "reply-delay", 0, "delay the processing of every request (a busy VPP)")
	fs.IntVar(&o.faults.HangUpAfter, "hang-up-after", 0, "close each connection after it received this many messages (0: never)")
	fs.BoolVar(&o.stall, "stall", false, "apply requests but answer none, control_ping included (a stalled VPP)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return o, vppsim.Config{}, err
		}
		return o, vppsim.Config{}, fmt.Errorf("%w: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return o, vppsim.Config{}, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if o.socket == "" {
		return o, vppsim.Config{}, fmt.Errorf("%w: --socket is required", errUsage)
	}
	if ifDelay < 0 || o.faults.ReplyDelay < 0 || o.faults.HangUpAfter < 0 {
		return o, vppsim.Config{}, fmt.Errorf("%w: --interfaces-after, --reply-delay and --hang-up-after must not be negative", errUsage)
	}
	if o.stall {
		o.faults.NoReply, o.faults.NoPingReply = true, true
	}
	if len(o.socket) > 107 {
		return o, vppsim.Config{}, fmt.Errorf("%w: --socket %q longer than the 107 bytes a unix socket path allows", errUsage, o.socket)
	}
	if ifOnDemand && ifDelay > 0 {
		return o, vppsim.Config{}, fmt.Errorf("%w: --interfaces-after and --interfaces-on-demand exclude each other", errUsage)
	}
	cfg := vppsim.Config{Interfaces: o.interfaces, Version: o.version, InterfaceDelay: ifDelay,
		InterfacesOnDemand: ifOnDemand, NoVXLAN: noVXLAN}
	for _, kv := range o.crcs {
		name, crc, ok := strings.Cut(kv, "=")
		if !ok || name == "" {
			return o, cfg, fmt.Errorf("%w: --crc %q: want NAME=CRC", errUsage, kv)
		}
		if cfg.CRCOverrides == nil {
			cfg.CRCOverrides = make(map[string]string)
		}
		cfg.CRCOverrides[name] = crc
	}
	return o, cfg, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	o, cfg, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	level := slog.LevelInfo
	if o.debug {
		level = slog.LevelDebug
	}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	sim, err := vppsim.New(cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	sim.SetFaults(o.faults)

	// Catch signals and open everything before announcing readiness.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var httpLn net.Listener
	if o.httpAddr != "" {
		if httpLn, err = net.Listen("tcp", o.httpAddr); err != nil {
			return fmt.Errorf("listen on --http %s: %w", o.httpAddr, err)
		}
	}
	if err := sim.Listen(o.socket); err != nil {
		if httpLn != nil {
			_ = httpLn.Close()
		}
		return err
	}
	ready := fmt.Sprintf("vppsim ready socket=%s pid=%d", sim.SocketPath(), sim.PID())
	if httpLn != nil {
		ready += " http=" + httpLn.Addr().String()
	}
	fmt.Fprintln(stdout, ready)

	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-hup:
				if err := sim.Restart(); err != nil {
					return fmt.Errorf("restart: %w", err)
				}
				fmt.Fprintf(stdout, "vppsim restarted pid=%d\n", sim.PID())
			}
		}
	})
	if httpLn != nil {
		srv := &http.Server{Handler: newHandler(sim), ReadHeaderTimeout: 5 * time.Second}
		g.Go(func() error {
			if err := srv.Serve(httpLn); !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("http: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			return srv.Shutdown(sctx)
		})
	}
	err = g.Wait()
	return errors.Join(err, sim.Close())
}

// newHandler serves the simulator's state as JSON.
func newHandler(sim *vppsim.Sim) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /fib", func(w http.ResponseWriter, r *http.Request) {
		src := r.URL.Query().Get("source")
		if src == vppsim.SourceAPI.String() {
			// API routes of every table, including those a better source shadows.
			writeJSON(w, apiRoutes(sim))
			return
		}
		routes := []vppsim.Route{}
		for _, rt := range sim.AllRoutes() {
			if src == "" || rt.Source.String() == src {
				routes = append(routes, rt)
			}
		}
		writeJSON(w, routes)
	})
	mux.HandleFunc("GET /interfaces", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, sim.Interfaces())
	})
	mux.HandleFunc("GET /requests", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, sim.RequestCounts())
	})
	// POST /interfaces creates the configured interfaces now (--interfaces-on-demand).
	mux.HandleFunc("POST /interfaces", func(w http.ResponseWriter, _ *http.Request) {
		if err := sim.CreateInterfaces(); err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	// DELETE /interface?name=X deletes an interface as "delete loopback interface" does (its routes stay,
	// dead); POST /interface?name=X creates one, answering its sw_if_index.
	mux.HandleFunc("DELETE /interface", func(w http.ResponseWriter, r *http.Request) {
		if err := sim.DeleteInterface(r.URL.Query().Get("name")); err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /interface", func(w http.ResponseWriter, r *http.Request) {
		idx, err := sim.CreateInterface(r.URL.Query().Get("name"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusConflict)
			return
		}
		writeJSON(w, map[string]uint32{"sw_if_index": idx})
	})
	// POST /neighbor?sw_if_index=N&address=A plays a resolved ARP/ND entry: VPP's adjacency /32 (/128).
	mux.HandleFunc("POST /neighbor", func(w http.ResponseWriter, r *http.Request) {
		idx, err := strconv.ParseUint(r.URL.Query().Get("sw_if_index"), 10, 32)
		if err != nil {
			http.Error(w, "sw_if_index: "+err.Error(), http.StatusBadRequest)
			return
		}
		a, err := netip.ParseAddr(r.URL.Query().Get("address"))
		if err != nil {
			http.Error(w, "address: "+err.Error(), http.StatusBadRequest)
			return
		}
		if err := sim.ResolveNeighbor(uint32(idx), a); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	// GET /bfd lists the BFD sessions; POST /bfd/peer?address=A&answering=true|false says whether the
	// simulated neighbour A answers BFD (see vppsim.Sim.SetBFDPeerAnswering).
	mux.HandleFunc("GET /bfd", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, sim.BFDSessions())
	})
	mux.HandleFunc("POST /bfd/peer", func(w http.ResponseWriter, r *http.Request) {
		a, err := netip.ParseAddr(r.URL.Query().Get("address"))
		if err != nil {
			http.Error(w, "address: "+err.Error(), http.StatusBadRequest)
			return
		}
		answering, err := strconv.ParseBool(r.URL.Query().Get("answering"))
		if err != nil {
			http.Error(w, "answering: "+err.Error(), http.StatusBadRequest)
			return
		}
		sim.SetBFDPeerAnswering(a, answering)
		w.WriteHeader(http.StatusNoContent)
	})
	// GET /forward?address=A[&table=N] returns the paths that carry A's traffic ([]: drop), with BFD's
	// effect (see vppsim.Sim.Forward).
	mux.HandleFunc("GET /forward", func(w http.ResponseWriter, r *http.Request) {
		a, err := netip.ParseAddr(r.URL.Query().Get("address"))
		if err != nil {
			http.Error(w, "address: "+err.Error(), http.StatusBadRequest)
			return
		}
		var table uint64
		if t := r.URL.Query().Get("table"); t != "" {
			if table, err = strconv.ParseUint(t, 10, 32); err != nil {
				http.Error(w, "table: "+err.Error(), http.StatusBadRequest)
				return
			}
		}
		paths := sim.Forward(uint32(table), a)
		if paths == nil {
			paths = []vppsim.Path{}
		}
		writeJSON(w, paths)
	})
	return mux
}

// apiRoutes returns the API routes of every table.
func apiRoutes(sim *vppsim.Sim) []vppsim.Route {
	seen := map[uint32]bool{}
	out := []vppsim.Route{}
	for _, r := range sim.AllRoutes() {
		if !seen[r.TableID] {
			seen[r.TableID] = true
			out = append(out, sim.APIRoutes(r.TableID)...)
		}
	}
	return out
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
