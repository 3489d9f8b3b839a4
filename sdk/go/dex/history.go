package dex

import (
	"container/list"
	"fmt"
)

// historySessions is how many sessions' views a Worker keeps (hello.history_cache), as
// the Python and TypeScript Workers do.
const historySessions = 1024

// historyCache keeps each session's model view as it was last handed out on this
// connection, least recently used sessions dropped first, so that a RunModel hand-out
// carries only the items the connection was not sent before (history_base says how many
// it builds on) and a turn costs the same in a long conversation as in a short one. The
// server keeps the same bound (hello.history_cache tells it), so it knows what the
// Worker has. Not safe for concurrent use: the Worker calls it with its lock held.
type historyCache struct {
	sessions int
	order    *list.List               // session ids, most recently used first
	views    map[string]*list.Element // session id → its element; Value is *cachedView
}

type cachedView struct {
	session string
	items   []Item
}

func newHistoryCache(sessions int) *historyCache {
	return &historyCache{sessions: sessions, order: list.New(), views: map[string]*list.Element{}}
}

// view is the model's view for a hand-out: the first base items of the view last handed
// out for the session, then items (checked here: only the new ones are). ok false: this
// Worker does not hold those base items (it dropped the session, or reconnected); the
// caller answers back with reason "history" and the server sends the whole view next.
// An error: an item does not fit the protocol.
func (c *historyCache) view(session string, base int, items []Item) (view []Item, ok bool, err error) {
	if err := checkItems(items, base); err != nil {
		c.forget(session)
		return nil, false, err
	}
	if base > 0 {
		e, held := c.views[session]
		if !held || len(e.Value.(*cachedView).items) < base {
			return nil, false, nil
		}
		kept := e.Value.(*cachedView).items
		// a new slice: a model call still running on the last view keeps seeing it whole
		view = make([]Item, 0, base+len(items))
		view = append(append(view, kept[:base]...), items...)
	} else {
		view = items
	}
	if e, held := c.views[session]; held {
		e.Value.(*cachedView).items = view
		c.order.MoveToFront(e)
	} else {
		c.views[session] = c.order.PushFront(&cachedView{session: session, items: view})
	}
	for c.order.Len() > c.sessions {
		oldest := c.order.Back()
		c.order.Remove(oldest)
		delete(c.views, oldest.Value.(*cachedView).session)
	}
	return view, true, nil
}

func (c *historyCache) forget(session string) {
	if e, held := c.views[session]; held {
		c.order.Remove(e)
		delete(c.views, session)
	}
}

// clear drops every view: a new connection starts with none, as the server assumes.
func (c *historyCache) clear() {
	c.order.Init()
	c.views = map[string]*list.Element{}
}

// checkItems checks what the protocol's Item union asks of each history item: a known
// type, and the fields that type requires. first is the index of items[0] in the view.
func checkItems(items []Item, first int) error {
	for i, item := range items {
		var missing string
		switch item.Type {
		case "user", "assistant", "note", "summary":
		case "tool_result":
			switch {
			case item.CallID == "":
				missing = "call_id"
			case item.Name == "":
				missing = "name"
			case item.Status == "":
				missing = "status"
			}
		default:
			return fmt.Errorf("history item %d has type %q: want user, assistant, tool_result, note or summary", first+i, item.Type)
		}
		if missing != "" {
			return fmt.Errorf("history item %d (%s) has no %s", first+i, item.Type, missing)
		}
	}
	return nil
}
