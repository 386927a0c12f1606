package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestNew(t *testing.T) {
	var buf bytes.Buffer
	log, err := New("warn", "json", &buf)
	if err != nil {
		t.Fatal(err)
	}
	log.Info("dropped")
	log.Warn("kept", "k", 1)
	var line map[string]any
	if err := json.Unmarshal(buf.Bytes(), &line); err != nil {
		t.Fatalf("want one JSON line, got %q: %v", buf.String(), err)
	}
	if line["msg"] != "kept" {
		t.Fatalf("got %v", line)
	}
	for _, c := range []struct{ level, format, flag string }{
		{"loud", "text", "--log-level"},
		{"info", "xml", "--log-format"},
	} {
		if _, err := New(c.level, c.format, &buf); err == nil || !strings.HasPrefix(err.Error(), c.flag) {
			t.Errorf("New(%q, %q) = %v, want an error naming %s", c.level, c.format, err, c.flag)
		}
	}
}
