package palcli

import "github.com/palrun/pal/provider"

// loadPrices loads the price file PAL_PRICES names, if any, over the
// embedded table: what a process that creates runs journals their models'
// prices from (runs.Client, and a worker's child runs through their
// parents). A file that does not parse is refused.
func (e *env) loadPrices() error {
	if path := e.getenv(provider.EnvPrices); path != "" {
		if err := provider.LoadPrices(path); err != nil {
			return withCode(ExitBadInput, err)
		}
	}
	return nil
}
