package calico

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Selector is a parsed Calico label selector, as an IPPool's spec.nodeSelector holds it. It implements
// the grammar of libcalico-go lib/selector (tokenizer/tokenizer.go, parser/parser.go): all(), has(k),
// k == "v", k != "v", k in {"a","b"}, k not in {...}, k contains "s", k starts with "s", k ends with "s",
// !, &&, || and parentheses, strings in single or double quotes. global() is refused: its meaning
// depends on namespaced resources, and an IP pool selects nodes.
type Selector struct {
	src  string
	root selNode
}

// selNode is one node of a parsed selector.
type selNode interface {
	eval(labels map[string]string) bool
}

type (
	selAll   struct{}
	selHas   struct{ key string }
	selNot   struct{ x selNode }
	selAnd   struct{ l, r selNode }
	selOr    struct{ l, r selNode }
	selMatch struct {
		key, op string
		vals    []string
	}
)

func (selAll) eval(map[string]string) bool { return true }
func (s selHas) eval(l map[string]string) bool {
	_, ok := l[s.key]
	return ok
}
func (s selNot) eval(l map[string]string) bool { return !s.x.eval(l) }
func (s selAnd) eval(l map[string]string) bool { return s.l.eval(l) && s.r.eval(l) }
func (s selOr) eval(l map[string]string) bool  { return s.l.eval(l) || s.r.eval(l) }

// eval follows Calico's parser/ast.go: != and "not in" hold for a missing label, the others do not.
func (s selMatch) eval(l map[string]string) bool {
	v, ok := l[s.key]
	switch s.op {
	case "==":
		return ok && v == s.vals[0]
	case "!=":
		return !ok || v != s.vals[0]
	case "in":
		return ok && slices.Contains(s.vals, v)
	case "not in":
		return !ok || !slices.Contains(s.vals, v)
	case "contains":
		return ok && strings.Contains(v, s.vals[0])
	case "starts with":
		return ok && strings.HasPrefix(v, s.vals[0])
	case "ends with":
		return ok && strings.HasSuffix(v, s.vals[0])
	}
	return false
}

// ParseSelector parses a Calico selector; "" selects everything (as an IPPool without nodeSelector).
func ParseSelector(s string) (Selector, error) {
	if strings.TrimSpace(s) == "" {
		return Selector{src: s, root: selAll{}}, nil
	}
	p := &selParser{in: s}
	n, err := p.or()
	if err == nil {
		p.skip()
		if p.pos < len(p.in) {
			err = fmt.Errorf("unexpected %q", p.in[p.pos:])
		}
	}
	if err != nil {
		return Selector{}, fmt.Errorf("selector %q: %w", s, err)
	}
	return Selector{src: s, root: n}, nil
}

// Matches reports whether the labels satisfy the selector.
func (s Selector) Matches(labels map[string]string) bool {
	if s.root == nil {
		return true
	}
	return s.root.eval(labels)
}

// String returns the selector as written.
func (s Selector) String() string { return s.src }

// selParser is a recursive-descent parser over the selector text.
type selParser struct {
	in  string
	pos int
}

func (p *selParser) skip() {
	for p.pos < len(p.in) && (p.in[p.pos] == ' ' || p.in[p.pos] == '\t') {
		p.pos++
	}
}

// eat consumes tok (after blanks) if it comes next; word tokens must end at a word boundary.
func (p *selParser) eat(tok string) bool {
	p.skip()
	if !strings.HasPrefix(p.in[p.pos:], tok) {
		return false
	}
	end := p.pos + len(tok)
	if isIdentChar(tok[len(tok)-1]) && end < len(p.in) && isIdentChar(p.in[end]) {
		return false
	}
	p.pos = end
	return true
}

func (p *selParser) or() (selNode, error) {
	l, err := p.and()
	for err == nil && p.eat("||") {
		var r selNode
		if r, err = p.and(); err == nil {
			l = selOr{l, r}
		}
	}
	return l, err
}

func (p *selParser) and() (selNode, error) {
	l, err := p.unary()
	for err == nil && p.eat("&&") {
		var r selNode
		if r, err = p.unary(); err == nil {
			l = selAnd{l, r}
		}
	}
	return l, err
}

func (p *selParser) unary() (selNode, error) {
	switch {
	case p.eat("!"):
		x, err := p.unary()
		return selNot{x}, err
	case p.eat("("):
		x, err := p.or()
		if err == nil && !p.eat(")") {
			err = errors.New("missing ')'")
		}
		return x, err
	case p.eat("all("):
		if !p.eat(")") {
			return nil, errors.New("no closing ')' after all(")
		}
		return selAll{}, nil
	case p.eat("global("):
		return nil, errors.New("global() is not supported in a node selector")
	case p.eat("has("):
		key, err := p.ident()
		if err == nil && !p.eat(")") {
			err = errors.New("no closing ')' after has(")
		}
		return selHas{key}, err
	}
	key, err := p.ident()
	if err != nil {
		return nil, err
	}
	for _, op := range []string{"==", "!=", "contains", "starts with", "ends with", "not in", "in"} {
		if !p.eatWords(op) {
			continue
		}
		m := selMatch{key: key, op: op}
		if op == "in" || op == "not in" {
			m.vals, err = p.set()
		} else {
			var v string
			v, err = p.str()
			m.vals = []string{v}
		}
		return m, err
	}
	return nil, fmt.Errorf("expected an operator after label %q", key)
}

// eatWords consumes a multi-word operator ("not in", "starts with"); as in Calico's tokenizer the blanks
// between its words are optional ("notin") and only its last word must end at a word boundary.
func (p *selParser) eatWords(op string) bool {
	save := p.pos
	words := strings.Fields(op)
	for i, w := range words {
		p.skip()
		if i == len(words)-1 {
			if p.eat(w) {
				return true
			}
		} else if strings.HasPrefix(p.in[p.pos:], w) {
			p.pos += len(w)
			continue
		}
		break
	}
	p.pos = save
	return false
}

func (p *selParser) ident() (string, error) {
	p.skip()
	start := p.pos
	for p.pos < len(p.in) && isIdentChar(p.in[p.pos]) {
		p.pos++
	}
	if p.pos == start {
		return "", fmt.Errorf("expected a label at %q", p.in[start:])
	}
	return p.in[start:p.pos], nil
}

func (p *selParser) str() (string, error) {
	p.skip()
	if p.pos >= len(p.in) || (p.in[p.pos] != '"' && p.in[p.pos] != '\'') {
		return "", fmt.Errorf("expected a quoted string at %q", p.in[p.pos:])
	}
	q := p.in[p.pos]
	end := strings.IndexByte(p.in[p.pos+1:], q)
	if end < 0 {
		return "", errors.New("unterminated string")
	}
	v := p.in[p.pos+1 : p.pos+1+end]
	p.pos += end + 2
	return v, nil
}

func (p *selParser) set() ([]string, error) {
	if !p.eat("{") {
		return nil, errors.New("expected '{' after in")
	}
	var out []string
	if p.eat("}") {
		return out, nil
	}
	for {
		v, err := p.str()
		if err != nil {
			return nil, err
		}
		out = append(out, v)
		if p.eat("}") {
			return out, nil
		}
		if !p.eat(",") {
			return nil, errors.New("expected ',' or '}' in a set")
		}
	}
}

// isIdentChar is Calico's label character set (tokenizer.identifierChar).
func isIdentChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '/' || c == '-'
}
