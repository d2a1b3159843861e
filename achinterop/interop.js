// Two Node implementations of NACHA files, driven by the parser's interoperability tests
// (tests/payments/nacha/test_interop.py):
//
//   node interop.js write < spec.json   writes each file of the spec with the library it names
//                                       ("node-nacha" or "nach2") and prints {"name": path}
//   node interop.js parse FILE          reads FILE with node-nacha's parser and prints its
//                                       batches and entries as JSON
//
// The spec is what the test states once for every implementation: a file header, then batches
// ({sec, description, effective_date YYMMDD, entries: [{name, routing, account,
// account_type "checking"|"savings", amount_cents, id, addenda?, direction?}]}): an entry is a
// debit unless its direction is "credit".
"use strict";

const fs = require("fs");
const path = require("path");
const nacha = require("@midlandsbank/node-nacha");
const nach2 = require("nach2");
// Not exported by the package's index.
const Nach2EntryAddenda = require("nach2/lib/entry-addenda");

function writeNodeNacha(spec) {
  const file = nacha.create({
    from: { name: spec.origin_name, fein: spec.immediate_origin },
    for: { name: spec.destination_name, routing: spec.destination_routing },
    idModifier: spec.file_id_modifier,
    referenceCode: "",
  });
  let batch = null;
  for (const b of spec.batches) {
    const kind = b.sec.toLowerCase();
    batch = (batch || file)[kind].call(batch || file, {
      effectiveDate: b.effective_date,
      description: b.description,
      companyName: spec.company_name,
      companyId: spec.company_identification,
      originatingDFIIdentification: spec.destination_routing.slice(0, 8),
    });
    for (const e of b.entries) {
      const add = e.direction === "credit" ? batch.credit : batch.debit;
      batch = add.call(batch, {
        name: e.name,
        account: { num: e.account, type: e.account_type === "savings" ? "S" : "C" },
        routing: e.routing,
        amount: e.amount_cents,
        identificationNumber: e.id,
        addenda: e.addenda,
        paymentTypeCode: "S",
      });
    }
  }
  return nacha.from(batch || file).to("ach");
}

function writeNach2(spec) {
  return new Promise((resolve) => {
    const file = new nach2.File({
      immediateDestination: spec.destination_routing,
      immediateOrigin: spec.immediate_origin,
      immediateDestinationName: spec.destination_name,
      immediateOriginName: spec.origin_name,
      fileIdModifier: spec.file_id_modifier,
      referenceCode: "INTEROP",
      batchSequenceNumber: 1,
    });
    for (const b of spec.batches) {
      const directions = new Set(b.entries.map((e) => e.direction || "debit"));
      const batch = new nach2.Batch({
        serviceClassCode: directions.size > 1 ? "200" : directions.has("credit") ? "220" : "225",
        companyName: spec.company_name,
        standardEntryClassCode: b.sec,
        companyIdentification: spec.company_identification,
        companyEntryDescription: b.description,
        companyDescriptiveDate: b.effective_date,
        effectiveEntryDate: new Date(
          2000 + Number(b.effective_date.slice(0, 2)),
          Number(b.effective_date.slice(2, 4)) - 1,
          Number(b.effective_date.slice(4, 6)),
        ),
        originatingDFI: spec.destination_routing.slice(0, 8),
      });
      for (const e of b.entries) {
        const entry = new nach2.Entry({
          receivingDFI: e.routing.slice(0, 8),
          DFIAccount: e.account,
          amount: (e.amount_cents / 100).toFixed(2), // nach2 takes dollars
          idNumber: e.id,
          individualName: e.name,
          discretionaryData: "  ", // nach2 takes no empty field
          transactionCode: (e.account_type === "savings" ? "3" : "2") + (e.direction === "credit" ? "2" : "7"),
        });
        if (e.addenda) {
          entry.addAddenda(new Nach2EntryAddenda({ paymentRelatedInformation: e.addenda }));
        }
        batch.addEntry(entry);
      }
      file.addBatch(batch);
    }
    file.generateFile(resolve);
  });
}

const WRITERS = { "node-nacha": writeNodeNacha, nach2: writeNach2 };

function parse(filePath) {
  const parsed = nacha.from(fs.readFileSync(filePath, "ascii"));
  const batches = parsed.data.batches.map((b) => ({
    sec: b.entryClassCode,
    company_name: String(b.companyName).trim(),
    description: String(b.description).trim(),
    entries: b.entries.map((e) => ({
      trace_number: String(e.traceNumber).padStart(15, "0"), // read as a number
      amount_cents: Number(e.amount),
      transaction_code: String(e.transactionCode),
    })),
  }));
  return { batches };
}

async function main() {
  const [command, argument] = process.argv.slice(2);
  if (command === "write") {
    const spec = JSON.parse(fs.readFileSync(0, "utf8"));
    const written = {};
    for (const [library, name] of Object.entries(spec.files)) {
      const target = path.join(spec.directory, name);
      fs.writeFileSync(target, await WRITERS[library](spec), "ascii");
      written[library] = target;
    }
    process.stdout.write(JSON.stringify(written));
  } else if (command === "parse") {
    process.stdout.write(JSON.stringify(parse(argument)));
  } else {
    process.stderr.write("usage: node interop.js write < spec.json | parse FILE\n");
    process.exit(2);
  }
}

main().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
