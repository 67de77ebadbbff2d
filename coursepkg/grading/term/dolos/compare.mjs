// Compare files with Dolos (https://dolos.ugent.be), for `coursepkg similarity`.
//
// Reads a JSON manifest on stdin: {"files": [paths], "ignore": path or null, "language": "python"}
// ("ignore": the template, whose fingerprints never count), and writes on stdout, as JSON, every
// pair Dolos finds with its similarity, longest fragment (in k-grams), coverage and fragments
// (0-based rows and columns in each file). DOLOS_LIB is the file URL of @dodona/dolos-lib's entry
// point, installed by `npm ci` from the package.json and package-lock.json beside this script.
const { Dolos } = await import(process.env.DOLOS_LIB);

const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const manifest = JSON.parse(Buffer.concat(chunks).toString("utf8"));
const dolos = new Dolos({ language: manifest.language || "python" });
const report = await dolos.analyzePaths(manifest.files, manifest.ignore || undefined);
const region = (r) => ({ startRow: r.startRow, startCol: r.startCol, endRow: r.endRow, endCol: r.endCol });
const pairs = report.allPairs().map((pair) => ({
  left: pair.leftFile.path,
  right: pair.rightFile.path,
  similarity: pair.similarity,
  longest: pair.longest,
  overlap: pair.overlap,
  leftCovered: pair.leftCovered,
  rightCovered: pair.rightCovered,
  leftTotal: pair.leftTotal,
  rightTotal: pair.rightTotal,
  fragments: pair.buildFragments().map((f) => ({ left: region(f.leftSelection), right: region(f.rightSelection) })),
}));
process.stdout.write(JSON.stringify({ warnings: report.warnings, pairs }));
