package shim

import (
	"bytes"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 300)
	f := AppendRecord([]byte(Magic), KeyStdin, big)
	f = AppendRecord(f, "CNI_COMMAND", []byte("ADD"))
	f = AppendRecord(f, KeyNetNS, nil)
	rec, err := ParseFrame(f)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(rec[KeyStdin], big) || string(rec["CNI_COMMAND"]) != "ADD" || len(rec) != 3 {
		t.Fatalf("parsed %q", rec)
	}
	if v, ok := rec[KeyNetNS]; !ok || len(v) != 0 {
		t.Fatalf("empty value: %q, %v", v, ok)
	}
	// Every truncation of a frame is an error, never a panic or a shorter frame taken for whole.
	for i := len(Magic); i < len(f); i++ {
		if rec, err := ParseFrame(f[:i]); err == nil && len(rec) == 3 {
			t.Fatalf("frame cut at %d of %d parsed whole", i, len(f))
		}
	}
	for _, bad := range []string{"", "block-ipam/1\n", Magic + "\x05ab", Magic + "\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"} {
		if _, err := ParseFrame([]byte(bad)); err == nil {
			t.Errorf("ParseFrame(%q) = nil error", bad)
		}
	}
	dup := AppendRecord(AppendRecord([]byte(Magic), "k", []byte("1")), "k", []byte("2"))
	if _, err := ParseFrame(dup); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate key: %v", err)
	}
}

func FuzzParseFrame(f *testing.F) {
	f.Add([]byte(Magic + "\x03abc\x01d"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := ParseFrame(b)
		if err != nil {
			return
		}
		// What parses re-encodes to a frame that parses the same.
		out := []byte(Magic)
		for k, v := range rec {
			out = AppendRecord(out, k, v)
		}
		again, err := ParseFrame(out)
		if err != nil || len(again) != len(rec) {
			t.Fatalf("re-encoded frame: %v, %d records of %d", err, len(again), len(rec))
		}
	})
}
