package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/deploy/monitoring"
)

// promInterval is the lab Prometheus's scrape and rule evaluation interval (and the block-ipamds'
// --capacity-interval): the lab is a handful of small targets, so every second costs nothing and an
// alert shows within seconds of its cause.
const promInterval = time.Second

// promTarget is one daemon of the lab that Prometheus scrapes.
type promTarget struct {
	job  string // the job name rules.yml's *Down alerts expect: vpp-route-agent or block-ipamd
	node string // the lab node, as the target label lab_node
	addr string // host:port of its /metrics
}

// promServer is the lab's Prometheus (Debian's package): the shipped rules, every daemon of the lab
// scraped, its configuration and TSDB under dir. The lab starts and stops it.
type promServer struct {
	addr string
	// ui is the base URL of the web UI's pages: Debian's package serves its classic UI under /classic/.
	ui     string
	dir    string
	log    string
	cmd    *exec.Cmd
	exited chan struct{}
}

// promConfig renders prometheus.yml: a job per daemon kind (the names rules.yml's *Down alerts
// expect), one target per node. No `node` target label: block_ipam_node_* carry their own.
func promConfig(targets []promTarget) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Written by vpplab: every daemon of the lab, the shipped rules (rules.yml).\n")
	fmt.Fprintf(&b, "global:\n  scrape_interval: %s\n  evaluation_interval: %s\n", promDuration(promInterval), promDuration(promInterval))
	fmt.Fprintf(&b, "rule_files:\n  - rules.yml\nscrape_configs:\n")
	for _, job := range []string{"vpp-route-agent", "block-ipamd"} {
		fmt.Fprintf(&b, "  - job_name: %s\n    static_configs:\n", job)
		for _, t := range targets {
			if t.job == job {
				fmt.Fprintf(&b, "      - targets: ['%s']\n        labels: {lab_node: '%s'}\n", t.addr, t.node)
			}
		}
	}
	return b.String()
}

var forLine = regexp.MustCompile(`(?m)^(\s+for:) \S+$`)

// labRules returns the shipped rules, with every alert's `for` replaced by alertFor when it is not
// negative (--alert-for: a demo or a test need not wait the 5-30 minutes an operator wants).
func labRules(alertFor time.Duration) []byte {
	if alertFor < 0 {
		return monitoring.Rules
	}
	return forLine.ReplaceAll(monitoring.Rules, []byte("$1 "+promDuration(alertFor)))
}

// promDuration spells d as Prometheus reads it (whole seconds).
func promDuration(d time.Duration) string {
	return fmt.Sprintf("%ds", int64(d/time.Second))
}

// startPrometheus writes the configuration and the rules under dir, runs bin listening on addr and
// waits until it is ready.
func startPrometheus(ctx context.Context, bin, dir, addr string, targets []promTarget, alertFor time.Duration) (*promServer, error) {
	if err := os.MkdirAll(filepath.Join(dir, "user"), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(promConfig(targets)), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yml"), labRules(alertFor), 0o644); err != nil {
		return nil, err
	}
	p := &promServer{addr: addr, dir: dir, log: filepath.Join(dir, "prometheus.log"), exited: make(chan struct{})}
	logf, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	p.cmd = exec.Command(bin,
		"--config.file", filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path", filepath.Join(dir, "data"),
		"--web.listen-address", addr,
		"--web.page-title", "vpplab Prometheus",
		// Pages dropped here are served at /user/, on Prometheus's origin: they may script its UI
		// (deploy/monitoring/lab-screenshot.sh opens an alert there before the screenshot).
		"--web.user-assets", filepath.Join(dir, "user"),
	)
	p.cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start prometheus: %w", err)
	}
	go func() { p.cmd.Wait(); close(p.exited) }()
	client := &http.Client{Timeout: time.Second}
	for deadline := time.Now().Add(30 * time.Second); ; {
		resp, err := client.Get("http://" + addr + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				p.ui = p.uiBase()
				return p, nil
			}
		}
		select {
		case <-p.exited:
			return nil, fmt.Errorf("prometheus exited: %v; see %s", p.cmd.ProcessState, p.log)
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("prometheus not ready on %s after 30s; see %s", addr, p.log)
		}
	}
}

// uiBase returns the base URL of the web UI: /classic when it serves /classic/alerts (Debian's
// package, built without the React UI), else the root.
func (p *promServer) uiBase() string {
	client := &http.Client{Timeout: 5 * time.Second}
	if resp, err := client.Get("http://" + p.addr + "/classic/alerts"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return "http://" + p.addr + "/classic"
		}
	}
	return "http://" + p.addr
}

// waitScraped waits until Prometheus has scraped each of its n targets once, up or down. It reads its
// targets from discovery only every 5 s after it starts: a counter that moved before its first scrape
// would start at its new value, and increase() (BlockIPAMClaimsRefused) would never see it move.
func (p *promServer) waitScraped(ctx context.Context, n int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		var body struct {
			Data struct {
				ActiveTargets []struct {
					Health string `json:"health"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		err := p.get(ctx, "/api/v1/targets", &body)
		scraped := 0
		for _, t := range body.Data.ActiveTargets {
			if t.Health != "unknown" {
				scraped++
			}
		}
		if err == nil && scraped == n {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("prometheus scraped %d of its %d targets in 30s (%v); see %s", scraped, n, err, p.log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop ends Prometheus as its service manager would (SIGTERM: it flushes its TSDB), killing it after
// 10 s.
func (p *promServer) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// promAlert is an alert as /api/v1/alerts reports it.
type promAlert struct {
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
	State       string            `json:"state"` // pending or firing
}

// name returns the alert with its labels, alertname first, as Prometheus's UI shows it.
func (a promAlert) name() string {
	var ls []string
	for k, v := range a.Labels {
		if k != "alertname" && k != "severity" {
			ls = append(ls, k+"="+v)
		}
	}
	slices.Sort(ls)
	return a.Labels["alertname"] + "{" + strings.Join(ls, ",") + "}"
}

// alerts reads the active (pending and firing) alerts from Prometheus's HTTP API.
func (p *promServer) alerts(ctx context.Context) ([]promAlert, error) {
	var body struct {
		Status string `json:"status"`
		Data   struct {
			Alerts []promAlert `json:"alerts"`
		} `json:"data"`
	}
	if err := p.get(ctx, "/api/v1/alerts", &body); err != nil {
		return nil, err
	}
	slices.SortFunc(body.Data.Alerts, func(a, b promAlert) int { return strings.Compare(a.name(), b.name()) })
	return body.Data.Alerts, nil
}

// get decodes the JSON answer of path.
func (p *promServer) get(ctx context.Context, path string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+path, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("prometheus %s: %w", path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("prometheus %s: %s", path, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("prometheus %s: %w", path, err)
	}
	return nil
}
