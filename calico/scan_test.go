package calico

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"
)

// slowRouting is DecodeRouting without the scanner: encoding/json alone.
func slowRouting(data []byte) (*Routing, error) {
	var r Routing
	if err := decodeBlockValue(data, &r, &r.CIDR); err != nil {
		return nil, err
	}
	return &r, nil
}

// calicoValues returns the block values of testdata, as stored (indented) and compacted, and a
// realistic block as EncodeBlock writes it.
func calicoValues(t testing.TB) map[string][]byte {
	values := map[string][]byte{}
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		v := loadTestdata(t, e.Name()).Value
		values[e.Name()] = v
		var c bytes.Buffer
		if err := json.Compact(&c, v); err != nil {
			t.Fatal(err)
		}
		values[e.Name()+" compact"] = c.Bytes()
	}
	values["encoded"] = encodedBlock(t)
	return values
}

// encodedBlock is a /26 with a tunnel address and two pods, one of them borrowed by another node.
func encodedBlock(t testing.TB) []byte {
	b := NewBlock(netip.MustParsePrefix("10.0.1.0/26"), "host:node-a", 1700000000000000000)
	for i, node := range []string{"node-a", "node-a", "node-b"} {
		h := fmt.Sprintf("k8s-pod-network.%064x", i)
		b.AutoAssign(1, AllocationAttribute{HandleID: &h, Secondary: map[string]string{
			AttrNamespace: "default", AttrNode: node, AttrPod: fmt.Sprintf("web-%d", i),
			AttrTimestamp: "2024-05-01 10:00:00.123456789 +0000 UTC",
		}}, nil)
	}
	v, err := EncodeBlock(b)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestScanRoutingReadsCalicoValues: the values Calico writes take the one-pass path, and read as
// encoding/json reads them.
func TestScanRoutingReadsCalicoValues(t *testing.T) {
	for name, v := range calicoValues(t) {
		var fast Routing
		if !scanRouting(v, &fast) {
			t.Errorf("%s: scanRouting left the value to encoding/json", name)
			continue
		}
		slow, err := slowRouting(v)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(&fast, slow) {
			t.Errorf("%s: scanRouting read %+v, encoding/json %+v", name, fast, *slow)
		}
	}
}

// TestScanRoutingDefers: values whose json.Unmarshal semantics the scanner does not reproduce, or that
// are not JSON, are left to encoding/json.
func TestScanRoutingDefers(t *testing.T) {
	for _, v := range []string{
		`{"cidr":"10.0.0.0/30","CIDR":"10.0.0.4/30"}`,                    // a field matched case-insensitively
		`{"cidr":"10.0.0.0/30","affinity":"host:a","affinity":"host:b"}`, // a repeated field
		`{"cidr":"10.0.0.0/30","affinity":"host:\u0061"}`,                // an escape in a string it reads
		"{\"cidr\":\"10.0.0.0/30\",\"affinity\":\"host:\xff\"}",          // invalid UTF-8 (replaced by encoding/json)
		`{"cidr":"10.0.0.0/30","hoſtAffinity":"a"}`,                      // a key that folds to a field
		`{"cidr":"10.0.0.0/30","attributes":[{"secondary":{"node":"a","Node":"b"}}]}`,
		`{"cidr":"10.0.0.0/30","attributes":[{"secondary":{"node":"a","pod":"node"}}]}`,
		`{"cidr":"10.0.0.0/30","attributes":[{"secondary":{"node":"a"},"Secondary":null}]}`,
		`{"cidr":"10.0.0.0/30","allocations":[1e0]}`,
		`{"cidr":"10.0.0.0/30","allocations":[12345678901234567890]}`,
		`{"cidr":"10.0.0.0/30","deleted":null}`,
		`{"cidr":"10.0.0.0/30","x":` + strings.Repeat("[", maxSkipDepth+1) + strings.Repeat("]", maxSkipDepth+1) + `}`,
		// Not JSON, or no valid CIDR.
		`{"cidr":"10.0.0.0/30"`, `{"cidr":"10.0.0.0/30"}x`, `{"cidr":"10.0.0.0/30",}`, `{"cidr":""}`, `{}`, `null`,
		`{"cidr":"10.0.0.0/30","x":01}`, `{"cidr":"10.0.0.0/30","x":"\q"}`, `{"cidr":"10.0.0.0/30","x":"` + "\t" + `"}`,
		`{"cidr":"10.0.0.0/30","x":[1,]}`, `{"cidr":"10.0.0.0/30","x":{"a"}}`, `{"cidr":"10.0.0.0/30","x":-}`,
		`{"cidr":"10.0.0.0/30","x":1.}`, `{"cidr":"10.0.0.0/30","x":tru}`, `{"cidr":"10.0.0.0/30","x":"\u12"}`,
	} {
		var r Routing
		if scanRouting([]byte(v), &r) {
			t.Errorf("scanRouting read %s as %+v; want it left to encoding/json", v, r)
		}
	}
}

// FuzzDecodeRouting: whenever the scanner reads a value, encoding/json reads the same from it.
func FuzzDecodeRouting(f *testing.F) {
	for _, v := range calicoValues(f) {
		f.Add(v)
	}
	f.Add([]byte(`{"cidr":"10.0.0.0/30","affinity":"host:x","allocations":[ 1 ,null, 0,9999999999,-3],"attributes":[null,{"secondary":{"node":"x"}},{"secondary":{"node":"y","pod":"p"}}],"deleted":false}`))
	f.Add([]byte(`{"cidr":"10.0.0.0/30","hostAffinity":"n","x":[{"a":[-0.5e+3,true,false,null,"\"\u00e9"]}],"attributes":[{"secondary":null}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var fast Routing
		if !scanRouting(data, &fast) {
			return
		}
		slow, err := slowRouting(data)
		if err != nil {
			t.Fatalf("scanRouting read %q, which encoding/json rejects: %v", data, err)
		}
		if !reflect.DeepEqual(&fast, slow) {
			t.Fatalf("scanRouting read %+v, encoding/json %+v", fast, *slow)
		}
	})
}

// BenchmarkDecodeRouting decodes a realistic block value with DecodeRouting, and with encoding/json
// alone, as DecodeRouting did before it had the scanner.
//
//	go test -run '^$' -bench DecodeRouting ./calico/
func BenchmarkDecodeRouting(b *testing.B) {
	v := encodedBlock(b)
	b.Run("scan", func(b *testing.B) {
		b.SetBytes(int64(len(v)))
		for b.Loop() {
			if _, err := DecodeRouting(v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.SetBytes(int64(len(v)))
		for b.Loop() {
			if _, err := slowRouting(v); err != nil {
				b.Fatal(err)
			}
		}
	})
}
