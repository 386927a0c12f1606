package vppapi

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
)

// TestLogrusBridge: GoVPP's logrus entries come out as slog records, one JSON object per line, with
// their level, message and fields, and one component key.
func TestLogrusBridge(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})).With("component", "govpp")
	lr := newLogrusBridge(pointTo(l))
	lr.WithField("msg_id", 42).Warn("reply channel full, dropping reply")
	lr.Debug("not shown at info")
	dbg := newLogrusBridge(pointTo(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	dbg.Debug("GoVPP's per-message debug lines only with DEBUG_GOVPP")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("%d lines, want 1:\n%s", len(lines), buf.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatalf("not JSON: %q: %v", lines[0], err)
	}
	if rec["level"] != "WARN" || rec["msg"] != "reply channel full, dropping reply" || rec["msg_id"] != float64(42) ||
		rec["component"] != "govpp" || strings.Count(lines[0], `"component"`) != 1 {
		t.Errorf("record %v", rec)
	}
}

// pointTo returns a pointer holding l.
func pointTo(l *slog.Logger) *atomic.Pointer[slog.Logger] {
	var p atomic.Pointer[slog.Logger]
	p.Store(l)
	return &p
}

// TestForwardGoVPPLogsAgain: a second call (a daemon run again in one process) sends GoVPP's entries to
// the new logger, without setting GoVPP's process-wide loggers again (its goroutines read them without
// a lock: the race detector caught a test that ran the daemon twice).
func TestForwardGoVPPLogsAgain(t *testing.T) {
	var first, second bytes.Buffer
	ForwardGoVPPLogs(slog.New(slog.NewTextHandler(&first, nil)))
	lr := govppLogs.lr
	ForwardGoVPPLogs(slog.New(slog.NewTextHandler(&second, nil)))
	if govppLogs.lr != lr {
		t.Fatal("GoVPP's logger was set again")
	}
	lr.Warn("to the second")
	if first.Len() != 0 || !strings.Contains(second.String(), "to the second") || !strings.Contains(second.String(), "component=govpp") {
		t.Errorf("first %q, second %q", first.String(), second.String())
	}
}
