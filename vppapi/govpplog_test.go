package vppapi

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

// TestLogrusBridge: GoVPP's logrus entries come out as slog records, one JSON object per line, with
// their level, message and fields, and one component key.
func TestLogrusBridge(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo})).With("component", "govpp")
	lr := newLogrusBridge(l)
	lr.WithField("msg_id", 42).Warn("reply channel full, dropping reply")
	lr.Debug("not shown at info")
	dbg := newLogrusBridge(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
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
