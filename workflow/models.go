package workflow

import (
	"slices"
	"strings"
)

// Models lists the models w names, in lower case, sorted, each once: the
// model (every model of a fallback list) of every ai-step and agent and of
// their confidence judges, in w
// and in the workflows nested in it (loop bodies, subagents). A model is
// never a template, so this is every model a run of w can call.
func (w *Workflow) Models() []string {
	seen := map[string]bool{}
	w.models(seen)
	out := make([]string, 0, len(seen))
	for m := range seen {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

func (w *Workflow) models(seen map[string]bool) {
	add := func(m string) {
		if m != "" {
			seen[strings.ToLower(m)] = true
		}
	}
	for i := range w.Nodes {
		n := &w.Nodes[i]
		switch n.Type {
		case TypeAIStep:
			if d, err := n.AIStep(); err == nil {
				for _, c := range d.Model.Choices(d.Provider) {
					add(c.Model)
				}
			}
		case TypeAgent:
			if d, err := n.Agent(); err == nil {
				for _, c := range d.Model.Choices(d.Provider) {
					add(c.Model)
				}
			}
		case TypeLoop, TypeSubagent:
			if sub, ok := w.Sub(n.ID); ok {
				sub.models(seen)
			}
		}
		if g := n.Confidence(); g != nil && g.Judge != nil {
			add(g.Judge.Model)
		}
	}
}
