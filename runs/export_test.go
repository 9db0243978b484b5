package runs

// SetCommandHook makes p run hook before each command it carries out (set
// it before Start): a test's way to make a handler fail on a given body.
func SetCommandHook(p *CommandProcessor, hook func(kind string, body []byte)) { p.hook = hook }
