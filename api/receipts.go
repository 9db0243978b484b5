package api

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/palrun/pal/receipt"
)

// receiptStore opens PAL_RECEIPTS on first use and keeps it.
func (h *handler) receiptStore(r *http.Request) (*receipt.Store, error) {
	h.receiptsMu.Lock()
	defer h.receiptsMu.Unlock()
	if h.receipts != nil {
		return h.receipts, nil
	}
	rs, err := receipt.Open(r.Context(), h.cfg.Store.JetStream(), h.cfg.Store)
	if err != nil {
		return nil, err
	}
	h.receipts = rs
	return rs, nil
}

// getReceipt answers GET /v1/runs/{id}/receipt: the stored receipt, or
// 404 naming why there is none (no such run, or not ended or not yet
// signed).
func (h *handler) getReceipt(w http.ResponseWriter, r *http.Request) {
	id, err := pathRunID(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	rs, err := h.receiptStore(r)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error(), "")
		return
	}
	rec, err := rs.Get(ctx, id)
	if errors.Is(err, receipt.ErrNotFound) {
		v, gerr := h.client.Get(ctx, id)
		if gerr != nil {
			h.fail(w, r, gerr)
			return
		}
		detail := fmt.Sprintf("run %s is %s: a receipt is signed when it ends", id, v.Status)
		if v.Status.Terminal() {
			detail = fmt.Sprintf("run %s has ended but is not signed yet: its worker signs at the end and the recovery sweep signs what a crash left (set PAL_SIGNING_KEY on the workers)", id)
		}
		writeError(w, http.StatusNotFound, "not_found", detail, "")
		return
	}
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error(), "")
		return
	}
	writeJSON(w, http.StatusOK, rec)
}

// keysBody is GET /v1/keys.
type keysBody struct {
	Keys []receipt.KeyDoc `json:"keys"`
}

func (h *handler) listKeys(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, keysBody{Keys: h.cfg.Keys.Docs()})
}
