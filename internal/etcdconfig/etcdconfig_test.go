package etcdconfig

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
)

func noSystemRoots() (*x509.CertPool, error) { return x509.NewCertPool(), nil }

func TestValidateNamesTheFlag(t *testing.T) {
	pki := etcdtest.NewPKI(t, t.TempDir())
	ok := Config{Endpoints: []string{"https://127.0.0.1:2379"}, CACertFile: pki.CA, DialTimeout: time.Second, RequestTimeout: time.Second}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		mod  func(c *Config)
		want string
	}{
		{func(c *Config) { c.Endpoints = []string{"http://127.0.0.1:2379"} }, "--etcd-ca-cert-file is set but --etcd-endpoints are http://"},
		{func(c *Config) {
			c.Endpoints, c.CACertFile, c.CertFile, c.KeyFile = []string{"http://127.0.0.1:2379"}, "", pki.ClientCert, pki.ClientKey
		},
			"--etcd-cert-file is set but"},
		{func(c *Config) { c.CACertFile, c.systemRoots = "", noSystemRoots }, "--etcd-ca-cert-file: required with https:// endpoints"},
		{func(c *Config) { c.CACertFile = pki.ClientKey }, "holds no PEM certificate"},
		{func(c *Config) { c.CertFile, c.KeyFile = pki.ClientCert, pki.ServerKey }, "--etcd-cert-file, --etcd-key-file: tls: private key does not match"},
		{func(c *Config) { c.CertFile = pki.ClientCert }, "go together"},
		{func(c *Config) { c.Endpoints = []string{"https://agent:hunter2@127.0.0.1:2379"} }, "https://agent:xxxxx@127.0.0.1:2379 carries credentials"},
		{func(c *Config) { c.Endpoints = []string{"https://127.0.0.1:2379/v3"} }, "is not scheme://host:port"},
		{func(c *Config) { c.Username = "agent" }, "no password"},
		{func(c *Config) { c.Password = "hunter2" }, "--etcd-username is not"},
		{func(c *Config) { c.RequestTimeout = 0 }, "--etcd-request-timeout"},
		{func(c *Config) { c.DialTimeout = 0 }, "--etcd-dial-timeout"},
	} {
		c := ok
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: err = %v, want %q", c, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "hunter2") {
			t.Errorf("the password is in the error: %v", err)
		}
	}
	// https:// without a CA file is fine when the system has CAs to verify with.
	c := ok
	c.CACertFile, c.systemRoots = "", func() (*x509.CertPool, error) {
		p := x509.NewCertPool()
		b, _ := os.ReadFile(pki.CA)
		p.AppendCertsFromPEM(b)
		return p, nil
	}
	if err := c.Validate(); err != nil {
		t.Errorf("https with system CAs: %v", err)
	}
}

func TestReadPassword(t *testing.T) {
	file := t.TempDir() + "/pw"
	os.WriteFile(file, []byte("from-file\n"), 0o600)
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	c := Config{PasswordFile: file}
	if err := c.ReadPassword(env(nil)); err != nil || c.Password != "from-file" {
		t.Errorf("file: %q %v", c.Password, err)
	}
	if err := c.ReadPassword(env(map[string]string{EnvPassword: "x"})); err == nil {
		t.Errorf("file and env together: no error")
	}
	c = Config{}
	if err := c.ReadPassword(env(map[string]string{EnvPassword: "from-env"})); err != nil || c.Password != "from-env" {
		t.Errorf("env: %q %v", c.Password, err)
	}
}

// TestProbeReportsCertificateErrorsAsSuch: a wrong CA, a host name that the certificate does not
// cover and a client certificate etcd does not trust are each reported at once as certificate errors
// naming the flag to check, never as a deadline.
func TestProbeReportsCertificateErrorsAsSuch(t *testing.T) {
	pki := etcdtest.NewPKI(t, t.TempDir())
	ep := "https://" + pki.ServeTLS(t, "127.0.0.1:0", true).Addr().String()
	base := Config{Endpoints: []string{ep}, CACertFile: pki.CA, CertFile: pki.ClientCert, KeyFile: pki.ClientKey,
		DialTimeout: 5 * time.Second, RequestTimeout: time.Second}
	if err := base.Probe(context.Background()); err != nil {
		t.Fatalf("good certificates: %v", err)
	}
	for _, tc := range []struct {
		mod  func(c *Config)
		want string
	}{
		{func(c *Config) { c.CACertFile = pki.OtherCA }, "server certificate not trusted (check --etcd-ca-cert-file)"},
		{func(c *Config) { c.CertFile, c.KeyFile = pki.OtherClientCert, pki.OtherClientKey }, "etcd refused the TLS handshake (check --etcd-cert-file and --etcd-key-file)"},
		{func(c *Config) { c.Endpoints = []string{strings.Replace(ep, "127.0.0.1", "localhost", 1)} }, "does not match the endpoint's host name"},
	} {
		c := base
		tc.mod(&c)
		err := c.Probe(context.Background())
		if err == nil || !errors.Is(err, ErrCertificate) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "deadline") {
			t.Errorf("err = %v, want a certificate error containing %q (not a deadline)", err, tc.want)
		}
	}
	// A closed port is not a certificate error.
	c := base
	c.Endpoints = []string{"https://127.0.0.1:1"}
	if err := c.Probe(context.Background()); err == nil || errors.Is(err, ErrCertificate) {
		t.Errorf("closed port: %v", err)
	}
}

func TestNoneReachable(t *testing.T) {
	c := Config{Endpoints: []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}, DialTimeout: time.Second, RequestTimeout: time.Second}
	err := c.Probe(context.Background())
	if !NoneReachable(err, 2) || !strings.Contains(err.Error(), "unreachable") || !strings.Contains(err.Error(), "127.0.0.1:2") {
		t.Errorf("two closed ports: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c.Endpoints[1] = "http://" + ln.Addr().String()
	if err := c.Probe(context.Background()); NoneReachable(err, 2) {
		t.Errorf("one endpoint listens: %v", err)
	}
}

// TestHTTPSAgainstPlaintextFailsAtOnce: an https:// endpoint whose etcd serves plaintext (it hangs up
// on the ClientHello) is a configuration error naming TLS, reported at once by Connect; a server that
// hangs up on every connection (a proxy without a backend) is not: it may come up later.
func TestHTTPSAgainstPlaintextFailsAtOnce(t *testing.T) {
	pki := etcdtest.NewPKI(t, t.TempDir())
	srv, _ := etcdtest.Start(t)
	c := Config{Endpoints: []string{strings.Replace(srv.Endpoint(), "http://", "https://", 1)}, CACertFile: pki.CA,
		DialTimeout: 5 * time.Second, RequestTimeout: time.Second}
	cli, err := c.Connect(context.Background(), slog.New(slog.DiscardHandler))
	if err == nil {
		cli.Close()
	}
	if !errors.Is(err, ErrNotTLS) || !strings.Contains(err.Error(), "plaintext") || !strings.Contains(err.Error(), "use http://") {
		t.Errorf("https:// against plaintext etcd: err = %v, want ErrNotTLS saying to use http://", err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	c.Endpoints = []string{"https://" + ln.Addr().String()}
	if err := c.Probe(context.Background()); err == nil || errors.Is(err, ErrNotTLS) || errors.Is(err, ErrCertificate) {
		t.Errorf("a server that hangs up: %v, want a transient failure", err)
	}
}
