package workflow

import (
	"bytes"
	"container/heap"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/palrun/pal/schemas"
)

// Parse decodes and validates a workflow document. It checks the document
// against schemas/workflow.schema.json, then the graph: unique node ids,
// exactly one trigger, edges between existing nodes, nothing leading into
// the trigger, no cycles, every node reachable from the trigger, conditions
// that compile, and templates that name only input or the output of a node
// that runs before theirs.
//
// A bad workflow gives a *ValidationError (matching ErrInvalid) listing
// every problem found; schema problems are reported before the graph is
// looked at. Any other error means the embedded schema is broken.
func Parse(raw []byte) (*Workflow, error) { return parseAt(raw, 0) }

// parseAt parses a workflow nested depth levels deep in its document.
func parseAt(raw []byte, depth int) (*Workflow, error) {
	doc, err := decodeDocument(raw)
	if err != nil {
		return nil, &ValidationError{unnamed: true, Problems: []Problem{{Edge: -1, Message: err.Error()}}}
	}
	name, named := docName(doc)
	if err := schemas.ValidateWorkflow(doc); err != nil {
		var ie *schemas.InvalidError
		if !errors.As(err, &ie) {
			return nil, fmt.Errorf("validating workflow: %w", err)
		}
		return nil, &ValidationError{Workflow: name, unnamed: !named, Problems: schemaProblems(doc, ie.Violations)}
	}

	var compact bytes.Buffer
	if err := json.Compact(&compact, raw); err != nil {
		return nil, &ValidationError{Workflow: name, Problems: []Problem{{Edge: -1, Message: "invalid JSON: " + err.Error()}}}
	}
	w := &Workflow{}
	if err := json.Unmarshal(compact.Bytes(), w); err != nil {
		return nil, &ValidationError{Workflow: name, Problems: []Problem{{Edge: -1, Message: "cannot decode: " + err.Error()}}}
	}
	w.raw = compact.Bytes()
	sum := sha256.Sum256(w.raw)
	w.hash = hex.EncodeToString(sum[:])
	w.exprs = &conditions{}
	w.depth = depth

	if ps := w.check(); len(ps) > 0 {
		return nil, &ValidationError{Workflow: w.Name, Problems: ps}
	}
	w.orderIdx = make([]int, len(w.order))
	for k, id := range w.order {
		w.orderIdx[k] = w.byID[id]
	}
	w.inAt, w.inFrom = make([][]Edge, len(w.Nodes)), make([][]int, len(w.Nodes))
	for i, n := range w.Nodes {
		if w.byID[n.ID] != i {
			continue // a duplicate id, refused by check
		}
		w.inAt[i] = w.edges(w.incoming[n.ID])
		for _, e := range w.inAt[i] {
			w.inFrom[i] = append(w.inFrom[i], w.byID[e.From])
		}
	}
	return w, nil
}

func docName(doc any) (string, bool) {
	obj, ok := doc.(map[string]any)
	if !ok {
		return "", false
	}
	name, ok := obj["name"].(string)
	return name, ok
}

// check runs the graph checks and fills the derived fields.
func (w *Workflow) check() problems {
	var ps problems

	// Node ids.
	w.byID = make(map[string]int, len(w.Nodes))
	var triggers []string
	for i, n := range w.Nodes {
		if j, dup := w.byID[n.ID]; dup {
			ps.node(n.ID, "id", "duplicate id: nodes[%d] and nodes[%d] both use it (ids must be unique)", j, i)
			continue
		}
		w.byID[n.ID] = i
		if n.Type == TypeTrigger {
			triggers = append(triggers, n.ID)
		}
	}
	switch len(triggers) {
	case 0:
		ps.workflow("nodes", `no trigger (add one node with "type": "trigger"; the run starts there)`)
	case 1:
	default:
		ps.workflow("nodes", "%d triggers (%s); a workflow has exactly one", len(triggers), quoteList(triggers))
	}

	// Edges.
	ids := w.nodeIDs()
	w.incoming = map[string][]int{}
	w.outgoing = map[string][]int{}
	seen := map[[2]string]int{}
	for i, e := range w.Edges {
		ok := true
		if _, found := w.byID[e.From]; !found {
			ps.edge(i, e, "from", "no node %q%s", e.From, suggest(e.From, ids))
			ok = false
		}
		if _, found := w.byID[e.To]; !found {
			ps.edge(i, e, "to", "no node %q%s", e.To, suggest(e.To, ids))
			ok = false
		}
		if !ok {
			continue
		}
		switch {
		case e.From == e.To:
			ps.edge(i, e, "", "a node cannot lead to itself (the graph must be acyclic)")
			continue
		case w.Nodes[w.byID[e.To]].Type == TypeTrigger:
			ps.edge(i, e, "to", "%q is the trigger; no edge may lead into it", e.To)
			continue
		}
		if j, dup := seen[[2]string{e.From, e.To}]; dup {
			ps.edge(i, e, "", `duplicate of edges[%d] (join their conditions with "or")`, j)
			continue
		}
		seen[[2]string{e.From, e.To}] = i
		w.outgoing[e.From] = append(w.outgoing[e.From], i)
		w.incoming[e.To] = append(w.incoming[e.To], i)
	}

	acyclic := w.sortTopologically(&ps)
	if len(triggers) == 1 {
		w.checkReachable(triggers[0], &ps)
	}
	var anc ancestry
	if acyclic {
		anc = w.ancestry()
	}

	// Node data: typed decoding, templates, expressions.
	for i := range w.Nodes {
		w.checkNode(&w.Nodes[i], anc, &ps)
	}
	for i, e := range w.Edges {
		if e.Condition == "" {
			continue
		}
		c, err := w.exprs.get(e.Condition)
		if err != nil {
			ps.edge(i, e, "condition", "%v", err)
			continue
		}
		if t := c.resultType(); t != nil && t.Kind() != reflect.Bool {
			ps.edge(i, e, "condition", "must give a boolean, not %s", t)
			continue
		}
		w.checkExprRefs(c, e.From, true, anc, func(msg string) { ps.edge(i, e, "condition", "%s", msg) })
	}
	if len(ps) > 0 {
		return ps
	}
	return nil
}

func (w *Workflow) nodeIDs() []string {
	ids := make([]string, len(w.Nodes))
	for i, n := range w.Nodes {
		ids[i] = n.ID
	}
	return ids
}

func quoteList(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}

// indexHeap is a min-heap of node indexes: Kahn's algorithm takes the ready
// node declared first.
type indexHeap []int

func (h indexHeap) Len() int           { return len(h) }
func (h indexHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h indexHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *indexHeap) Push(x any)        { *h = append(*h, x.(int)) }
func (h *indexHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// sortTopologically fills w.order and reports a cycle as a problem. Nodes
// with a duplicate id are left out.
func (w *Workflow) sortTopologically(ps *problems) bool {
	indeg := make(map[string]int, len(w.byID))
	for id, ins := range w.incoming {
		indeg[id] = len(ins)
	}
	h := &indexHeap{}
	for id, i := range w.byID {
		if indeg[id] == 0 {
			*h = append(*h, i)
		}
	}
	heap.Init(h)
	w.order = make([]string, 0, len(w.byID))
	for h.Len() > 0 {
		id := w.Nodes[heap.Pop(h).(int)].ID
		w.order = append(w.order, id)
		for _, ei := range w.outgoing[id] {
			to := w.Edges[ei].To
			if indeg[to]--; indeg[to] == 0 {
				heap.Push(h, w.byID[to])
			}
		}
	}
	if len(w.order) == len(w.byID) {
		return true
	}
	ps.workflow("edges", "cycle %s (the graph must be acyclic; use a loop node to repeat steps)", w.findCycle(indeg))
	w.order = nil
	return false
}

// findCycle returns one cycle among the nodes left with incoming edges,
// as "a → b → a", starting from the first such node declared.
func (w *Workflow) findCycle(indeg map[string]int) string {
	start := ""
	for _, n := range w.Nodes {
		if indeg[n.ID] > 0 {
			start = n.ID
			break
		}
	}
	// Walk backwards along incoming edges from nodes still in the cycle
	// set until a node repeats; every such node has an in-cycle
	// predecessor.
	pos := map[string]int{}
	var path []string
	cur := start
	for {
		if i, ok := pos[cur]; ok {
			cyc := slices.Clone(path[i:])
			slices.Reverse(cyc)
			// Start at the node declared first.
			first := 0
			for j, id := range cyc {
				if w.byID[id] < w.byID[cyc[first]] {
					first = j
				}
			}
			cyc = append(cyc[first:], cyc[:first]...)
			cyc = append(cyc, cyc[0])
			return strings.Join(cyc, " → ")
		}
		pos[cur] = len(path)
		path = append(path, cur)
		next := ""
		for _, ei := range w.incoming[cur] {
			if from := w.Edges[ei].From; indeg[from] > 0 {
				next = from
				break
			}
		}
		if next == "" {
			return strings.Join(path, " → ")
		}
		cur = next
	}
}

func (w *Workflow) checkReachable(trigger string, ps *problems) {
	reached := map[string]bool{trigger: true}
	queue := []string{trigger}
	for len(queue) > 0 {
		id := queue[0]
		queue = queue[1:]
		for _, ei := range w.outgoing[id] {
			if to := w.Edges[ei].To; !reached[to] {
				reached[to] = true
				queue = append(queue, to)
			}
		}
	}
	for i, n := range w.Nodes {
		if w.byID[n.ID] != i || reached[n.ID] {
			continue
		}
		ps.node(n.ID, "", "not reachable from the trigger %q (add an edge leading to it)", trigger)
	}
}

// ancestry answers "does x run before y": x is an ancestor of y in the
// graph. It is nil when the graph has a cycle, and then answers true.
type ancestry map[string]map[string]bool

func (a ancestry) before(x, y string) bool {
	if a == nil {
		return true
	}
	return a[y][x]
}

func (w *Workflow) ancestry() ancestry {
	anc := make(ancestry, len(w.order))
	for _, id := range w.order {
		set := map[string]bool{}
		for _, ei := range w.incoming[id] {
			from := w.Edges[ei].From
			set[from] = true
			for a := range anc[from] {
				set[a] = true
			}
		}
		anc[id] = set
	}
	return anc
}

// checkNode checks one node's data beyond the schema.
func (w *Workflow) checkNode(n *Node, anc ancestry, ps *problems) {
	tmpl := func(field, s string) {
		w.checkTemplate(n.ID, s, anc, func(msg string) { ps.node(n.ID, field, "%s", msg) })
	}
	tmplJSON := func(field string, v json.RawMessage) {
		if len(v) == 0 {
			return
		}
		err := walkJSON(v, func(loc, s string) ([]byte, error) {
			tmpl(joinLoc(field, loc), s)
			return nil, nil
		}, &bytes.Buffer{})
		if err != nil {
			ps.node(n.ID, field, "%v", err)
		}
	}
	decodeProblem := func(err error) {
		field, msg := decodeErrorField(err)
		ps.node(n.ID, field, "%s", msg)
	}
	switch n.Type {
	case TypeAIStep:
		d, err := n.AIStep()
		if err != nil {
			decodeProblem(err)
			return
		}
		tmpl("data.prompt", d.Prompt)
		tmpl("data.system", d.System)
		for i, m := range d.Messages {
			field := fmt.Sprintf("data.messages[%d]", i)
			tmpl(field+".content", m.Content)
			checkImages(n, field, m, tmpl, ps)
		}
		checkLLM(n, d.Provider, d.Model, d.ResponseSchema, d.Retry, ps)
		checkThread(n, d.Thread, d.ThreadWindow, ps)
		checkFake(n, d.Fake, nil, false, ps)
	case TypeTool:
		d, err := n.Tool()
		if err != nil {
			decodeProblem(err)
			return
		}
		tmplJSON("data.input", d.Input)
		tmplJSON("data.arguments", d.Arguments)
		switch {
		case d.MCP != "" && len(d.Input) > 0:
			ps.node(n.ID, "data.input", "an MCP tool (data.mcp %q) takes data.arguments, not data.input", d.MCP)
		case d.MCP == "" && len(d.Arguments) > 0:
			ps.node(n.ID, "data.arguments", "arguments are an MCP tool's: set data.mcp to the server's name, or use data.input")
		}
	case TypeConnector:
		d, err := n.Connector()
		if err != nil {
			decodeProblem(err)
			return
		}
		if d.Kind == ConnectorEmail {
			w.checkEmail(n.ID, d, tmpl, ps)
			return
		}
		if d.From != "" || d.To != "" || d.Cc != "" || d.Subject != "" || d.Text != "" || d.HTML != "" {
			ps.node(n.ID, "data", "from, to, cc, subject, text and html are email fields; set kind to \"email\"")
		}
		tmpl("data.url", d.URL)
		if msg := checkURL(d.URL); msg != "" {
			ps.node(n.ID, "data.url", "%s", msg)
		}
		for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
			tmpl(joinField("data.headers", k), d.Headers[k])
		}
		tmplJSON("data.body", d.Body)
	case TypeApproval, TypeLoop, TypeSubagent, TypeAgent, TypeProcess, TypeWait:
		w.checkNewNode(n, tmpl, tmplJSON, decodeProblem, ps)
	case TypeCondition:
		d, err := n.Condition()
		if err != nil {
			decodeProblem(err)
			return
		}
		c, err := w.exprs.get(d.Expression)
		if err != nil {
			ps.node(n.ID, "data.expression", "%v", err)
			return
		}
		w.checkExprRefs(c, n.ID, false, anc, func(msg string) { ps.node(n.ID, "data.expression", "%s", msg) })
	}
}

// decodeErrorField maps an error from a typed accessor to a field and a
// message.
func decodeErrorField(err error) (string, string) {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		if strings.HasPrefix(te.Value, "number ") && te.Type != nil && te.Type.Kind() >= reflect.Int && te.Type.Kind() <= reflect.Uint64 {
			return "data." + te.Field, fmt.Sprintf("must be written as a whole number (got %s)", strings.TrimPrefix(te.Value, "number "))
		}
		return "data." + te.Field, fmt.Sprintf("cannot use %s as %s", te.Value, te.Type)
	}
	return "data", err.Error()
}

// checkURL checks the fixed start of a connector URL template: it must be
// an http or https URL, unless a placeholder supplies the whole start.
func checkURL(u string) string {
	fixed := u
	if i := strings.Index(u, "{{"); i >= 0 {
		fixed = u[:i]
	}
	if fixed == "" {
		return ""
	}
	lower := strings.ToLower(fixed)
	if !strings.HasPrefix(lower, "http://") && !strings.HasPrefix(lower, "https://") {
		if strings.HasPrefix("http://", lower) || strings.HasPrefix("https://", lower) {
			return "" // the scheme is completed by a placeholder
		}
		return fmt.Sprintf("%q is not an http or https URL", u)
	}
	if fixed != u {
		return ""
	}
	p, err := url.Parse(u)
	if err != nil {
		return fmt.Sprintf("invalid URL: %v", err)
	}
	if p.Host == "" {
		return fmt.Sprintf("%q has no host", u)
	}
	return ""
}

// checkTemplate checks that s parses and that its placeholders name input
// or the output of a node that runs before node self.
func (w *Workflow) checkTemplate(self, s string, anc ancestry, report func(string)) {
	if !strings.Contains(s, "{{") {
		return
	}
	t, err := parseTemplate(s)
	if err != nil {
		report(err.Error())
		return
	}
	for _, ph := range t.phs {
		if msg := w.checkPath(ph.path, self, anc); msg != "" {
			report("template " + ph.String() + ": " + msg)
		}
	}
}

func (w *Workflow) checkPath(path []segment, self string, anc ancestry) string {
	if err := checkPathShape(path); err != nil {
		return err.Error()
	}
	if path[0].field != rootSteps {
		return ""
	}
	return w.checkStepRef(path[1].field, self, false, anc)
}

// checkStepRef checks that node id exists and runs before self, or is self
// when selfOK (an edge's condition may read the edge's source node).
func (w *Workflow) checkStepRef(id, self string, selfOK bool, anc ancestry) string {
	if _, ok := w.byID[id]; !ok {
		return fmt.Sprintf("no node %q%s", id, suggest(id, w.nodeIDs()))
	}
	if id == self {
		if !selfOK {
			return fmt.Sprintf("node %q cannot use its own output", self)
		}
		return ""
	}
	if !anc.before(id, self) {
		return fmt.Sprintf("%q does not run before %q (add a path of edges from %q to %q)", id, self, id, self)
	}
	return ""
}

// checkExprRefs checks the steps.<id> an expression names. self is the
// condition node, or the edge's source node (whose output an edge may read:
// ownOK).
func (w *Workflow) checkExprRefs(c *condition, self string, ownOK bool, anc ancestry, report func(string)) {
	for _, r := range c.refs {
		if msg := w.checkStepRef(r.id, self, ownOK, anc); msg != "" {
			report("steps." + r.id + ": " + msg)
			continue
		}
		if r.member != "" && r.member != "[]" && r.member != fieldOut && r.member != fieldStatus && r.member != fieldError {
			report(fmt.Sprintf("steps.%s has no field %q (want steps.%s.output…, .status or .error)", r.id, r.member, r.id))
		}
	}
}

// checkEmail checks an email connector: its fields are templates, the
// header fields may not hold CR or LF (the connector checks the rendered
// values again), and the webhook fields do not apply.
func (w *Workflow) checkEmail(id string, d *ConnectorData, tmpl func(field, s string), ps *problems) {
	for _, f := range []struct{ name, v string }{{"from", d.From}, {"to", d.To}, {"cc", d.Cc}, {"subject", d.Subject}} {
		tmpl("data."+f.name, f.v)
		if strings.ContainsAny(f.v, "\r\n") {
			ps.node(id, "data."+f.name, "contains a line break; CR and LF are refused in email headers")
		}
	}
	tmpl("data.text", d.Text)
	tmpl("data.html", d.HTML)
	if d.URL != "" || d.Method != "" || len(d.Headers) > 0 || len(d.Body) > 0 {
		ps.node(id, "data", "url, method, headers and body are webhook fields; an email has from, to, cc, subject, text and html")
	}
}
