package calico

import "math"

// scanRouting reads the routing part of a block value into r in one pass over data, without
// reflection, for the values Calico writes. It reports false when it cannot stand in for
// encoding/json: the value is not valid JSON, a field routing reads has an unexpected type or form, the
// CIDR is missing or invalid, or the value uses a feature whose json.Unmarshal semantics it does not
// reproduce (escapes or non-ASCII in a key or in a string it reads, a key matching a field only
// case-insensitively, a repeated field, deep nesting). The caller then decodes with encoding/json,
// which decides, and words the error. When it reports true, r is what encoding/json would have read
// (FuzzDecodeRouting checks it).
//
// Decoding 100,000 blocks with encoding/json (a validation pass, then a reflective one) was most of
// an agent's CPU time while it listed etcd, the bulk of it skipping the fields routing does not read.
func scanRouting(data []byte, r *Routing) bool {
	s := scanner{data: data}
	s.ws()
	var seen uint8
	ok := s.object(func(key []byte) bool {
		f := routingFieldOf(key)
		if f < 0 {
			return false
		}
		if f > 0 {
			if seen&(1<<f) != 0 {
				return false // a repeated field: encoding/json merges, or reuses slice elements
			}
			seen |= 1 << f
		}
		switch f {
		case fieldCIDR:
			v, ok := s.plainString()
			return ok && r.CIDR.UnmarshalText(v) == nil
		case fieldAffinity:
			var ok bool
			r.Affinity, ok = s.optionalString()
			return ok
		case fieldHostAffinity:
			var ok bool
			r.HostAffinity, ok = s.optionalString()
			return ok
		case fieldAllocations:
			return s.allocations(&r.Allocations)
		case fieldAttributes:
			return s.attributes(&r.Attributes)
		case fieldDeleted:
			var ok bool
			r.Deleted, ok = s.boolean()
			return ok
		}
		return s.skip(0)
	})
	s.ws()
	return ok && s.pos == len(s.data) && r.CIDR.IsValid()
}

// The fields of Routing, by their JSON names; fieldOther is any other key, fieldAmbiguous one that
// encoding/json might match to a field other than by its exact name.
const (
	fieldAmbiguous = iota - 1
	fieldOther
	fieldCIDR
	fieldAffinity
	fieldHostAffinity
	fieldAllocations
	fieldAttributes
	fieldDeleted
)

var routingFields = [...]string{
	fieldCIDR: "cidr", fieldAffinity: "affinity", fieldHostAffinity: "hostAffinity",
	fieldAllocations: "allocations", fieldAttributes: "attributes", fieldDeleted: "deleted",
}

// routingFieldOf returns the field a key (plain: ASCII, no escape) names. encoding/json matches keys to
// fields ignoring case; a key that matches only so is left to it.
func routingFieldOf(key []byte) int {
	for f, name := range routingFields {
		if f != fieldOther && len(key) == len(name) && asciiEqualFold(key, name) {
			if string(key) != name {
				return fieldAmbiguous
			}
			return f
		}
	}
	return fieldOther
}

func asciiEqualFold(b []byte, s string) bool {
	for i := range b {
		x, y := b[i], s[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// scanner is a position in a JSON text. Its methods report false on anything they do not read: input
// that is not JSON, or JSON whose decoding they leave to encoding/json.
type scanner struct {
	data []byte
	pos  int
}

// maxSkipDepth bounds the nesting the scanner skips (encoding/json allows 10,000; deeper values are
// left to it).
const maxSkipDepth = 100

func (s *scanner) ws() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

func (s *scanner) consume(c byte) bool {
	if s.pos < len(s.data) && s.data[s.pos] == c {
		s.pos++
		return true
	}
	return false
}

func (s *scanner) literal(lit string) bool {
	if len(s.data)-s.pos >= len(lit) && string(s.data[s.pos:s.pos+len(lit)]) == lit {
		s.pos += len(lit)
		return true
	}
	return false
}

// key reads an object key and the colon after it; the key must be plain (see plainString).
func (s *scanner) key() ([]byte, bool) {
	k, ok := s.plainString()
	if !ok {
		return nil, false
	}
	s.ws()
	return k, s.consume(':')
}

// object reads an object whose keys are plain, calling member with each key and the scanner at the
// value, which member must read.
func (s *scanner) object(member func(key []byte) bool) bool {
	if !s.consume('{') {
		return false
	}
	for first := true; ; first = false {
		s.ws()
		if first && s.consume('}') {
			return true
		}
		key, ok := s.key()
		if !ok {
			return false
		}
		s.ws()
		if !member(key) {
			return false
		}
		s.ws()
		if s.consume('}') {
			return true
		}
		if !s.consume(',') {
			return false
		}
	}
}

// array reads an array, calling elem with the scanner at each element, which elem must read.
func (s *scanner) array(elem func() bool) bool {
	if !s.consume('[') {
		return false
	}
	for first := true; ; first = false {
		s.ws()
		if first && s.consume(']') {
			return true
		}
		if !elem() {
			return false
		}
		s.ws()
		if s.consume(']') {
			return true
		}
		if !s.consume(',') {
			return false
		}
	}
}

// plainString reads a string that needs no unquoting, ASCII without escapes (encoding/json replaces
// invalid UTF-8, which a byte-wise copy would not), and returns its contents.
func (s *scanner) plainString() ([]byte, bool) {
	if !s.consume('"') {
		return nil, false
	}
	start := s.pos
	for ; s.pos < len(s.data); s.pos++ {
		c := s.data[s.pos]
		if c == '"' {
			s.pos++
			return s.data[start : s.pos-1], true
		}
		if c < 0x20 || c == '\\' || c >= 0x80 {
			return nil, false
		}
	}
	return nil, false
}

// optionalString reads a *string field: null or a plain string.
func (s *scanner) optionalString() (*string, bool) {
	if s.literal("null") {
		return nil, true
	}
	v, ok := s.plainString()
	if !ok {
		return nil, false
	}
	str := string(v)
	return &str, true
}

func (s *scanner) boolean() (bool, bool) {
	if s.literal("true") {
		return true, true
	}
	return false, s.literal("false")
}

// allocations reads the allocations array: null or integers, as allocations.UnmarshalJSON does.
func (s *scanner) allocations(out *allocations) bool {
	if s.literal("null") {
		*out = nil
		return true
	}
	var a allocations
	ord := int32(0)
	ok := s.array(func() bool {
		if !s.literal("null") {
			v, ok := s.integer()
			if !ok {
				return false
			}
			if v < 0 || v > math.MaxInt32 {
				v = -1
			}
			if a == nil {
				a = make(allocations, 0, 4) // a block holds few addresses of other nodes, or none
			}
			a = append(a, allocation{ord: ord, idx: int32(v)})
		}
		ord++
		return ord > 0
	})
	*out = a
	return ok
}

// integer reads a JSON number written as an integer (no fraction or exponent) of at most 18 digits.
func (s *scanner) integer() (int64, bool) {
	neg := s.consume('-')
	start := s.pos
	var v int64
	for s.pos < len(s.data) && '0' <= s.data[s.pos] && s.data[s.pos] <= '9' {
		v = v*10 + int64(s.data[s.pos]-'0')
		s.pos++
	}
	digits := s.pos - start
	if digits == 0 || digits > 18 || digits > 1 && s.data[start] == '0' {
		return 0, false
	}
	if s.pos < len(s.data) {
		switch s.data[s.pos] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	if neg {
		v = -v
	}
	return v, true
}

// attributes reads the attributes array: objects (or null, a zero attribute) of which only the
// secondary object's node is read.
func (s *scanner) attributes(out *[]routingAttribute) bool {
	if s.literal("null") {
		*out = nil
		return true
	}
	a := []routingAttribute{}
	var last string // the node of the previous attribute: most name the same one
	ok := s.array(func() bool {
		var attr routingAttribute
		if !s.literal("null") {
			node, ok := s.attribute()
			if !ok {
				return false
			}
			if string(node) != last {
				last = string(node)
			}
			attr.Secondary = secondaryNode(last)
		}
		if cap(a) == 0 {
			a = make([]routingAttribute, 0, 4)
		}
		a = append(a, attr)
		return true
	})
	*out = a
	return ok
}

// attribute reads an attribute object and returns the node its secondary object names (a part of the
// scanner's data, or nil).
func (s *scanner) attribute() ([]byte, bool) {
	var node []byte
	seen := false
	ok := s.object(func(key []byte) bool {
		switch {
		case string(key) == "secondary":
			if seen {
				return false
			}
			seen = true
			var ok bool
			node, ok = s.secondary()
			return ok
		case len(key) == len("secondary") && asciiEqualFold(key, "secondary"):
			return false
		}
		return s.skip(0)
	})
	return node, ok
}

// secondary reads a secondary attributes object as secondaryNode.UnmarshalJSON does when the object
// names the node once, exactly and without escapes (exactNodeKey); any other object it leaves to
// encoding/json. Without escapes, every `"node"` in the object's text is a string token, so counting
// the keys and string values that fold to node is exactNodeKey's count; nested values are left to
// exactNodeKey itself.
func (s *scanner) secondary() ([]byte, bool) {
	if s.literal("null") {
		return nil, true
	}
	start := s.pos
	var value []byte
	nodes, nested := 0, false
	ok := s.object(func(key []byte) bool {
		nodes += foldsToNode(key)
		switch {
		case s.pos < len(s.data) && s.data[s.pos] == '"':
			v, ok := s.plainString()
			if !ok {
				return false // an escape, or a non-ASCII value: encoding/json decides
			}
			nodes += foldsToNode(v)
			if string(key) == AttrNode {
				value = v
			}
			return true
		case string(key) == AttrNode:
			return s.literal("null")
		}
		nested = true
		return s.skip(0)
	})
	if !ok || nested && !exactNodeKey(s.data[start:s.pos]) || nodes > 1 || nodes == 1 && value == nil {
		return nil, false
	}
	return value, true
}

// foldsToNode is 1 if b is "node" in any letter case, else 0.
func foldsToNode(b []byte) int {
	if len(b) == len(AttrNode) && asciiEqualFold(b, AttrNode) {
		return 1
	}
	return 0
}

// skip passes over one JSON value of any kind, checking its syntax.
func (s *scanner) skip(depth int) bool {
	if s.pos >= len(s.data) {
		return false
	}
	switch c := s.data[s.pos]; {
	case c == '"':
		return s.skipString()
	case c == '{' || c == '[':
		if depth >= maxSkipDepth {
			return false
		}
		s.pos++
		end := byte('}')
		if c == '[' {
			end = ']'
		}
		for first := true; ; first = false {
			s.ws()
			if first && s.consume(end) {
				return true
			}
			if c == '{' {
				if !s.skipString() {
					return false
				}
				s.ws()
				if !s.consume(':') {
					return false
				}
				s.ws()
			}
			if !s.skip(depth + 1) {
				return false
			}
			s.ws()
			if s.consume(end) {
				return true
			}
			if !s.consume(',') {
				return false
			}
		}
	case c == '-' || '0' <= c && c <= '9':
		return s.skipNumber()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	}
	return false
}

// skipString passes over a string, checking its escapes; like encoding/json it accepts any bytes
// but control characters.
func (s *scanner) skipString() bool {
	if !s.consume('"') {
		return false
	}
	for s.pos < len(s.data) {
		c := s.data[s.pos]
		s.pos++
		switch {
		case c == '"':
			return true
		case c < 0x20:
			return false
		case c == '\\':
			if s.pos >= len(s.data) {
				return false
			}
			e := s.data[s.pos]
			s.pos++
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(s.data)-s.pos < 4 {
					return false
				}
				for _, h := range s.data[s.pos : s.pos+4] {
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return false
					}
				}
				s.pos += 4
			default:
				return false
			}
		}
	}
	return false
}

// skipNumber passes over a number: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (s *scanner) skipNumber() bool {
	s.consume('-')
	if s.consume('0') {
	} else if !s.digits() {
		return false
	}
	if s.consume('.') && !s.digits() {
		return false
	}
	if s.consume('e') || s.consume('E') {
		if !s.consume('+') {
			s.consume('-')
		}
		if !s.digits() {
			return false
		}
	}
	return true
}

// digits passes over one or more decimal digits.
func (s *scanner) digits() bool {
	start := s.pos
	for s.pos < len(s.data) && '0' <= s.data[s.pos] && s.data[s.pos] <= '9' {
		s.pos++
	}
	return s.pos > start
}
