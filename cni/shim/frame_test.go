package shim

import (
	"bytes"
	"strings"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 300)
	r := AppendRecord(nil, KeyStdin, big)
	r = AppendRecord(r, "CNI_COMMAND", []byte("ADD"))
	r = AppendRecord(r, KeyNetNS, nil)
	f := Seal(r)
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
	// Every truncation of a frame is an error, never a panic or a shorter frame taken for whole; a
	// reader knows the frame's size once it has its head, and not before.
	for i := 0; i < len(f); i++ {
		if _, err := ParseFrame(f[:i]); err == nil {
			t.Fatalf("frame cut at %d of %d parsed", i, len(f))
		}
		size, ok := FrameSize(f[:i])
		if ok != (i >= len(Magic)+2) || (ok && size != len(f)) {
			t.Fatalf("FrameSize of the first %d bytes of %d: %d, %v", i, len(f), size, ok)
		}
	}
	if _, err := ParseFrame(append(f, 0)); err == nil {
		t.Error("a frame with a byte after its end parsed")
	}
	for _, bad := range []string{"", "block-ipam/2\n\x00", Magic + "\x03\x05ab", Magic + "\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"} {
		if _, err := ParseFrame([]byte(bad)); err == nil {
			t.Errorf("ParseFrame(%q) = nil error", bad)
		}
	}
	if _, ok := FrameSize([]byte("block-ipam/2\n\x00")); ok {
		t.Error("FrameSize took another release's frame for one")
	}
	dup := Seal(AppendRecord(AppendRecord(nil, "k", []byte("1")), "k", []byte("2")))
	if _, err := ParseFrame(dup); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate key: %v", err)
	}
}

func FuzzParseFrame(f *testing.F) {
	f.Add([]byte(Magic + "\x05\x03abc\x01d"))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := ParseFrame(b)
		if err != nil {
			return
		}
		// What parses re-encodes to a frame that parses the same.
		var out []byte
		for k, v := range rec {
			out = AppendRecord(out, k, v)
		}
		again, err := ParseFrame(Seal(out))
		if err != nil || len(again) != len(rec) {
			t.Fatalf("re-encoded frame: %v, %d records of %d", err, len(again), len(rec))
		}
	})
}
