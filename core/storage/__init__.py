"""The storage seam: records and leases, each with a local twin (a folder) and a Blob twin (a container),
the one registry that picks the twin from a location's scheme, and Azure's errors translated once.

    records.py       the record store: create-if-absent, read with version, replace-if-version, list by
                     prefix, delete; name and tag rules
    leases.py        the lease: take without waiting, hold (renewed), release, who holds it; waiting for one
    local.py         both in a folder: files written whole, flock(2) leases
    blob.py          both in a Blob container: conditional puts, blob leases; the container client built once
    azure_errors.py  Azure's failures as one-line errors, and which of them are worth a retry
    locations.py     the registry: a folder or file:// -> local, https://<account>.blob... or Azurite -> Blob
"""
