package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// PKI is a test certificate authority with a server certificate for 127.0.0.1, a client certificate,
// and a second, unrelated CA, all written as PEM files.
type PKI struct {
	CA, OtherCA                     string // CA certificates
	ServerCert, ServerKey           string
	ClientCert, ClientKey           string
	OtherClientCert, OtherClientKey string // signed by OtherCA
}

// NewPKI writes a PKI into dir.
func NewPKI(t testing.TB, dir string) PKI {
	t.Helper()
	ca, caKey := issue(t, dir, "ca", nil, nil)
	other, otherKey := issue(t, dir, "other-ca", nil, nil)
	issue(t, dir, "server", ca, caKey)
	issue(t, dir, "client", ca, caKey)
	issue(t, dir, "other-client", other, otherKey)
	f := func(n string) string { return filepath.Join(dir, n) }
	return PKI{CA: f("ca.pem"), OtherCA: f("other-ca.pem"), ServerCert: f("server.pem"), ServerKey: f("server-key.pem"),
		ClientCert: f("client.pem"), ClientKey: f("client-key.pem"),
		OtherClientCert: f("other-client.pem"), OtherClientKey: f("other-client-key.pem")}
}

// issue creates name.pem and name-key.pem, signed by parent (a CA when parent is nil).
func issue(t testing.TB, dir, name string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	isCA := parent == nil
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:        isCA, BasicConstraintsValid: true,
	}
	if isCA {
		tmpl.KeyUsage |= x509.KeyUsageCertSign
		parent, parentKey = tmpl, key
	} else {
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(file, typ string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, file), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(name+".pem", "CERTIFICATE", der)
	write(name+"-key.pem", "EC PRIVATE KEY", kder)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// ServeTLS listens on addr ("127.0.0.1:0" for any port) with the PKI's server certificate, as an etcd
// with TLS does (requiring a client certificate signed by the CA when clientAuth is set), completes
// each handshake, waits for one byte or the peer's close, and hangs up; until the test ends.
func (p PKI) ServeTLS(t testing.TB, addr string, clientAuth bool) net.Listener {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(p.ServerCert, p.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}
	if clientAuth {
		pool := x509.NewCertPool()
		b, err := os.ReadFile(p.CA)
		if err != nil {
			t.Fatal(err)
		}
		pool.AppendCertsFromPEM(b)
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	ln, err := tls.Listen("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if c.(*tls.Conn).Handshake() == nil {
					c.Read(make([]byte, 1))
				}
			}()
		}
	}()
	return ln
}
