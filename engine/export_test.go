package engine

// Comparable is st without what only speeds things up (Next's loop memos,
// lazily decoded input and outputs): two states that fold the same
// journal are equal as Comparable, however they were built.
func Comparable(st *RunState) RunState {
	c := *st
	c.loops, c.loopNodes, c.settled, c.input, c.decoded = nil, nil, nil, nil, false
	c.Steps = make(map[string]*Step, len(st.Steps))
	for id, s := range st.Steps {
		cs := *s
		cs.outVal, cs.decoded = nil, false
		c.Steps[id] = &cs
	}
	return c
}
