package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// probeCmd asks the running daemon's HTTP server for a path (/healthz, /readyz) and succeeds on 200:
// an exec probe for Kubernetes, which cannot reach a server listening on loopback with httpGet.
func probeCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) (string, bool)) error {
	fs := pflag.NewFlagSet("vpp-route-agent probe", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("metrics-address", defaultMetricsAddress, "the daemon's --metrics-address")
	timeout := fs.Duration("timeout", 3*time.Second, "deadline of the request")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: vpp-route-agent probe [flags] /healthz|/readyz\n\n"+
			"Asks the agent running on this host for a health path and exits 0 if it answers 200.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := parseWithEnv(fs, args, getenv); err != nil {
		return err
	}
	if fs.NArg() != 1 || !strings.HasPrefix(fs.Arg(0), "/") {
		return usageError{fmt.Errorf("want one path, e.g. /readyz; got %q", fs.Args())}
	}
	host, port, err := net.SplitHostPort(*addr)
	if err != nil || *addr == "" {
		return usageError{fmt.Errorf("--metrics-address %q: %v", *addr, err)}
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1" // a server on every address also answers on loopback
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+net.JoinHostPort(host, port)+fs.Arg(0), nil)
	if err != nil {
		return usageError{err}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("probe %s: %w", fs.Arg(0), err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	stdout.Write(body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe %s: %s", fs.Arg(0), resp.Status)
	}
	return nil
}
