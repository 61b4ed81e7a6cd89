package engine

// takeUpTo splits the packs of snapshots the workers reported into those of epochs <= epoch,
// taken, and the rest. A pack all of whose snapshots are taken is taken as it is, without a
// copy; a pack that holds both is split into two fresh packs, and returned in spent: its
// snapshots are all copied, so the caller may reuse it at once.
//
// A commit that covers several epochs (the writer fell behind) gets every snapshot of them,
// several of a key among them: the store keeps the newest of each key (see recovery.Store).
func takeUpTo(packs []*Pack, epoch uint64) (taken, spent, rest []*Pack) {
	for _, p := range packs {
		lo, hi := p.Epochs()
		switch {
		case lo > epoch:
			rest = append(rest, p)
		case hi <= epoch:
			taken = append(taken, p)
		default:
			in, out := &Pack{}, &Pack{}
			for s := range p.All() {
				if s.Epoch <= epoch {
					in.AddSnapshot(s)
				} else {
					out.AddSnapshot(s)
				}
			}
			taken, rest, spent = append(taken, in), append(rest, out), append(spent, p)
		}
	}
	return taken, spent, rest
}
