package etcdtest

import (
	"fmt"
	"net/url"
	"path/filepath"
	"testing"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// StartTLS starts an embedded etcd that serves https:// with the PKI's server certificate and requires
// client certificates signed by its CA, until the test ends, and returns its client URL.
func StartTLS(tb testing.TB, pki PKI, dir string) string {
	tb.Helper()
	cp, err := FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	pp, err := FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	cfg := embed.NewConfig()
	cfg.Name = "tls"
	cfg.Dir = filepath.Join(dir, "etcd-tls")
	cu, _ := url.Parse(fmt.Sprintf("https://127.0.0.1:%d", cp))
	pu, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", pp))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	cfg.ClientTLSInfo = transport.TLSInfo{CertFile: pki.ServerCert, KeyFile: pki.ServerKey, TrustedCAFile: pki.CA, ClientCertAuth: true}
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		tb.Fatal("TLS etcd not ready")
	}
	return cu.String()
}
