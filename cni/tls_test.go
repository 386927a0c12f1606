package cni

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// writeCert issues a certificate for 127.0.0.1 signed by ca (self-signed when ca is nil) and writes
// it and its key as PEM files; it returns the certificate and key for signing others.
func writeCert(t *testing.T, dir, name string, ca *x509.Certificate, caKey *ecdsa.PrivateKey, isCA bool) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:         isCA, BasicConstraintsValid: true,
	}
	parent, signer := tmpl, key
	if ca != nil {
		parent, signer = ca, caKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	if err := os.WriteFile(filepath.Join(dir, name+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+"-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key
}

func freePort(t *testing.T) int {
	p, err := etcdtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestEtcdTLS: https endpoints with a CA and a client certificate, configured as a user would, reach
// an etcd that requires client certificates; without the client certificate the request fails as
// unavailable.
func TestEtcdTLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := writeCert(t, dir, "ca", nil, nil, true)
	writeCert(t, dir, "server", ca, caKey, false)
	writeCert(t, dir, "client", ca, caKey, false)

	cfg := embed.NewConfig()
	cfg.Name = "tls"
	cfg.Dir = filepath.Join(dir, "data")
	cu, _ := url.Parse("https://127.0.0.1:" + itoa(freePort(t)))
	pu, _ := url.Parse("http://127.0.0.1:" + itoa(freePort(t)))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.ClientTLSInfo = transport.TLSInfo{CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem"),
		TrustedCAFile: filepath.Join(dir, "ca.pem"), ClientCertAuth: true}
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcd not ready")
	}

	conf := func(withClientCert bool) *Config {
		im := map[string]any{"type": "block-ipam", "etcd_endpoints": cu.String(), "nodename": "n1",
			"etcd_ca_cert_file": filepath.Join(dir, "ca.pem")}
		if withClientCert {
			im["etcd_cert_file"], im["etcd_key_file"] = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
		}
		data, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "net1", "ipam": im})
		c, err := LoadConfig(data, "", func(string) string { return "" }, os.Hostname)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	c := conf(true)
	cli, err := newEtcdClient(c.Endpoints, c.tls, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.close()
	if res, err := cli.txn(ctx, []compare{absent("/k")}, []op{putOp("/k", []byte("v"))}, nil); err != nil || !res.Succeeded {
		t.Fatalf("put over TLS: %+v %v", res, err)
	}
	if res, err := cli.txn(ctx, nil, []op{getOp("/k")}, nil); err != nil || string(res.Ranges[0][0].Value) != "v" {
		t.Fatalf("get over TLS: %v", err)
	}

	c = conf(false)
	anon, _ := newEtcdClient(c.Endpoints, c.tls, 2*time.Second)
	if _, err := anon.txn(ctx, nil, []op{getOp("/k")}, nil); !errors.Is(err, errUnavailable) {
		t.Fatalf("without a client certificate: %v", err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
