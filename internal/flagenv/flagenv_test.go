package flagenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func TestNodeNameOrder(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "nodename")
	if n, _ := NodeName(" flag-node ", file); n != "flag-node" {
		t.Errorf("flag: %q", n)
	}
	os.WriteFile(file, []byte("file-node\n"), 0o644)
	if n, _ := NodeName("", file); n != "file-node" {
		t.Errorf("file: %q", n)
	}
	h, _ := os.Hostname()
	if n, _ := NodeName("", filepath.Join(dir, "missing")); n != strings.ToLower(strings.TrimSpace(h)) {
		t.Errorf("hostname: %q, want %q", n, strings.ToLower(h))
	}
	os.WriteFile(file, []byte("a/b\n"), 0o644)
	if _, err := NodeName("", file); err == nil || !strings.Contains(err.Error(), "(from "+file+")") {
		t.Errorf("bad name from the file: %v", err)
	}
}

// TestApply: the environment fills the flags not given, names Calico's variable where there is one,
// skips the excepted flags and names the variable of a bad value.
func TestApply(t *testing.T) {
	e := Env{Prefix: "X_", Calico: map[string]string{"etcd-endpoints": "ETCD_ENDPOINTS"}}
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	given := fs.String("given", "", "")
	table := fs.Int("table-id", 0, "")
	eps := fs.String("etcd-endpoints", "", "")
	node := fs.String("nodename", "", "")
	yes := fs.Bool("yes", false, "")
	e.Annotate(fs)
	if u := fs.Lookup("table-id").Usage; u != " (env X_TABLE_ID)" {
		t.Errorf("usage %q", u)
	}
	if err := fs.Parse([]string{"--given", "flag"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"X_GIVEN": "env", "X_TABLE_ID": "7", "ETCD_ENDPOINTS": "http://e:2379", "NODENAME": "n1", "X_YES": "true"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if err := e.Apply(fs, lookup, "yes"); err != nil {
		t.Fatal(err)
	}
	if *given != "flag" || *table != 7 || *eps != "http://e:2379" || *node != "n1" || *yes {
		t.Errorf("got given=%q table=%d eps=%q node=%q yes=%v", *given, *table, *eps, *node, *yes)
	}
	fs2 := pflag.NewFlagSet("t", pflag.ContinueOnError)
	fs2.Int("table-id", 0, "")
	env = map[string]string{"X_TABLE_ID": "seven"}
	if err := e.Apply(fs2, lookup); err == nil || !strings.Contains(err.Error(), "environment X_TABLE_ID (for --table-id)") {
		t.Errorf("bad value: %v", err)
	}
}
